-- Phases mode for providers that do not dedup by key, and keys whose outcome only a person can settle.
--
-- attempted_at: set (durably) just before the external call of such a phase, cleared when the key
-- moves on. A worker that finds it set knows a call may have reached the provider: it looks the effect
-- up (the phase's `lookup`) before it calls again, and never calls blindly.
-- lookup_failures: lookups that could not tell (the provider did not answer); past the runner's limit
-- the key goes to review.
-- needs_review_at: the outcome is unknown. The key answers 409 operation-uncertain, the completer leaves
-- it alone, and it waits for `idem keys settle`. Adding nullable columns (and one with a constant
-- default) changes only the catalog: no partition is rewritten.
ALTER TABLE {{schema}}.keys
  ADD COLUMN attempted_at    timestamptz,
  ADD COLUMN lookup_failures integer NOT NULL DEFAULT 0,
  ADD COLUMN needs_review_at timestamptz;

-- One row per key sent to review, kept outside the partitioned keys table: the sweep that drops a
-- partition never removes a review, settled or not. The settlement (who, when, what) is recorded here.
CREATE TABLE {{schema}}.reviews (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  scope          text        NOT NULL,
  key            text        NOT NULL,
  key_created_at timestamptz NOT NULL,
  runner         text,
  recovery_point text        NOT NULL,
  request        jsonb,
  phase_data     jsonb,
  reason         text        NOT NULL,
  opened_at      timestamptz NOT NULL,
  settled_at     timestamptz,
  settled_by     text,
  settlement     jsonb
);
-- At most one open review per key; the gauge and `idem keys list --state needs_review` read this index.
CREATE UNIQUE INDEX reviews_open ON {{schema}}.reviews (scope, key, key_created_at) WHERE settled_at IS NULL;
