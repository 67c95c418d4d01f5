-- Idempotency keys, partitioned by creation time so that expired keys are dropped a partition at a time.
--
-- A partition holds the keys whose `bucket` (floor(created_at epoch / partition_seconds)) is one value.
-- PostgreSQL cannot enforce a unique index across partitions, so (scope, key) is unique per bucket;
-- claims near a bucket boundary also insert a `marker` row into the previous bucket so that two
-- concurrent duplicates on either side of the boundary still meet on one unique index (see src/postgres/phases/claim.ts; atomic mode serialises on a per-key lock instead).

CREATE TABLE {{schema}}.settings (
  id                boolean PRIMARY KEY DEFAULT true CHECK (id),
  partition_seconds integer NOT NULL CHECK (partition_seconds >= 60)
);
INSERT INTO {{schema}}.settings (partition_seconds) VALUES ({{partition_seconds}});

CREATE TABLE {{schema}}.keys (
  bucket          integer     NOT NULL,
  scope           text        NOT NULL,
  key             text        NOT NULL,
  marker          boolean     NOT NULL DEFAULT false,
  fingerprint     bytea       NOT NULL,
  created_at      timestamptz NOT NULL,
  -- 'started' (claimed, not finished), a phase name in phases mode, or 'done'.
  recovery_point  text        NOT NULL DEFAULT 'started',
  status          smallint,
  headers         jsonb,
  body            bytea,
  PRIMARY KEY (scope, key, bucket)
) PARTITION BY RANGE (bucket);
