-- The secret operation references are sealed with (src/core/operation-ref.ts, src/postgres/secrets/ref-keys.ts)
-- when the store has no encryption keys of its own: made here, once, from the server's strong random
-- source (gen_random_uuid: 122 random bits each; two make the 32 bytes), so that references are opaque
-- and unforgeable from the first start, and keep opening after a restart and on every instance. Kept in
-- settings, which the service's role may read and not change. Its id is random too, so that the shards
-- of a ShardedStore tell their references apart. Stores given encryption keys seal new references
-- with keys derived from those (rotated with them); this one still opens what it sealed.
ALTER TABLE {{schema}}.settings ADD COLUMN ref_key_id text, ADD COLUMN ref_secret bytea;
UPDATE {{schema}}.settings
   SET ref_key_id = 'db-' || substr(replace(gen_random_uuid()::text, '-', ''), 1, 12),
       ref_secret = decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');
