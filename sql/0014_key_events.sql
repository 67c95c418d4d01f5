-- A key's history in phases mode: every claim, recovery point, lease taken (a takeover names the token
-- it replaced), fenced write refused, provider lookup, review and saved answer, appended by the
-- statement that makes the change (a data-modifying CTE: no extra round trip). The key row keeps only
-- its latest state; this is what the console's timeline reads (key-admin.ts). Atomic mode writes none:
-- its claim and saved answer are one transaction.
--
-- Partitioned like the keys, by the KEY's bucket (not the event's time): a key's events live in the
-- partition of the same number as its row, made and dropped with it by the same code (partitions.ts),
-- so a key's history goes exactly when the key's retention goes, a partition at a time, with no DELETE.
-- The running service's role may INSERT and SELECT here, not UPDATE or DELETE (`runtimeGrants`).
CREATE TABLE {{schema}}.key_events (
  bucket   integer     NOT NULL,  -- the key row's bucket
  claim_id uuid,                  -- the key row's claim id (which claim of the key)
  scope    text        NOT NULL,
  key      text        NOT NULL,
  at       timestamptz NOT NULL,  -- the database's now (the store's time shift in tests)
  kind     text        NOT NULL,  -- claimed, recovery-point, lease-taken, takeover, ... (history.ts)
  token    uuid,                  -- the lease (fencing) token of the worker that wrote it
  details  jsonb
) PARTITION BY RANGE (bucket);
CREATE INDEX key_events_claim ON {{schema}}.key_events (claim_id, at);

-- A partition for each keys partition there is (later ones are made with the keys' own).
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT substring(c.relname FROM 'keys_b(-?[0-9]+)$') AS b, pg_get_expr(c.relpartbound, c.oid) AS bound
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = '{{schema}}.keys'::regclass AND c.relname ~ '^keys_b-?[0-9]+$'
  LOOP
    EXECUTE format('CREATE TABLE {{schema}}.%I PARTITION OF {{schema}}.key_events %s', 'key_events_b' || r.b, r.bound);
  END LOOP;
END $$;
