-- Which encryption key new values are sealed with, shared by every instance (src/postgres/secrets/sealing-keys.ts).
-- sealing_key holds one row: the promoted key. sealing_readers lists the running instances and the key
-- ids each can open, seen_at by the database's clock: a key is promoted only when every live reader
-- opens it, so no instance ever seals with a key another cannot open while instances roll.
CREATE TABLE {{schema}}.sealing_key (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  key_id text NOT NULL,
  promoted_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {{schema}}.sealing_readers (
  instance uuid PRIMARY KEY,
  key_ids text[] NOT NULL,
  seen_at timestamptz NOT NULL DEFAULT now()
);
