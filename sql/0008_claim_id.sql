-- The claim identity: which claim of a key a row is. A key expires and may be claimed again; each
-- claim gets a new id, kept by every retry and takeover of that claim. It is what a phases runner
-- hands a provider as the downstream idempotency key and lookup reference (never `scope:key`, which
-- outlives our retention: the provider would answer a reused key with the old claim's effect).
--
-- Added without a default, so that no partition is rewritten; the default then applies to new rows
-- only (on every partition, present and future). Rows claimed before this migration keep a NULL id
-- and the downstream key they were started with.
ALTER TABLE {{schema}}.keys ADD COLUMN claim_id uuid;
ALTER TABLE {{schema}}.keys ALTER COLUMN claim_id SET DEFAULT gen_random_uuid();
