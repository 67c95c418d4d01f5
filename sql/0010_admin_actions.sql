-- Every action a person takes on idem's records (the admin API, the console at /admin, `idem keys
-- settle|forget`): who, when, what, on which key or message, and why. A plain table outside the
-- partitioned keys and inbox tables: no sweep drops it. The service's runtime role may INSERT and SELECT
-- here but not UPDATE or DELETE (`runtimeGrants`): the record is append-only for the running code.
CREATE TABLE {{schema}}.admin_actions (
  id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at      timestamptz NOT NULL DEFAULT now(),
  actor   text        NOT NULL,
  action  text        NOT NULL,  -- e.g. key.settle, key.forget, outbox.requeue, inbox.unpark, audit.run
  scope   text,                  -- the key acted on, when the action is about one
  key     text,
  target  text,                  -- what else it names: an event id, an aggregate, consumer/message id
  reason  text,                  -- why, in the person's words
  details jsonb                  -- what was done (the settlement, counts, the audit's results)
);
CREATE INDEX admin_actions_key ON {{schema}}.admin_actions (scope, key, at) WHERE key IS NOT NULL;
CREATE INDEX admin_actions_action ON {{schema}}.admin_actions (action, at);
