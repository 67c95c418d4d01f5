-- Messaging: what the outbox relay needs beyond 0002's table, and the consumers' inbox.

-- A row that failed `max attempts` times is parked: the relay leaves it alone (and, with per-aggregate
-- ordering, holds back the later events of its aggregate) until someone requeues it.
ALTER TABLE {{schema}}.outbox ADD COLUMN parked_at timestamptz;

-- The relay's claim, with per-aggregate ordering: "is there an older unpublished event of this
-- aggregate?" is answered from this index alone.
CREATE INDEX outbox_aggregate_unpublished ON {{schema}}.outbox (aggregate_id, id)
  WHERE published_at IS NULL AND aggregate_id IS NOT NULL;

-- Retention: published rows older than the window are deleted oldest first.
CREATE INDEX outbox_published ON {{schema}}.outbox (published_at) WHERE published_at IS NOT NULL;

-- Wake idle relays as soon as events commit (they also poll, so a lost notification only delays).
-- Statement-level, so a transaction that writes a thousand events sends one notification; PostgreSQL
-- folds identical notifications of one transaction together anyway.
CREATE FUNCTION {{schema}}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{{schema}}_outbox', '');
  RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON {{schema}}.outbox
  FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.outbox_notify();

-- The inbox: one row per message a consumer has finished, written in the same transaction as the
-- message's effect. `message_id` is the producer's id (the outbox event id), the same in every copy.
-- status: 'done' (the effect committed) or 'parked' (it failed `max attempts` times; see inbox_parked).
CREATE TABLE {{schema}}.inbox (
  consumer     text        NOT NULL,
  message_id   text        NOT NULL,
  status       text        NOT NULL DEFAULT 'done',
  processed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);
-- Retention of the dedup marks (keep them longer than any redelivery can take).
CREATE INDEX inbox_processed_at ON {{schema}}.inbox (processed_at);

-- Failed attempts of messages not finished yet, counted across redeliveries, processes and brokers.
CREATE TABLE {{schema}}.inbox_attempts (
  consumer   text        NOT NULL,
  message_id text        NOT NULL,
  attempts   integer     NOT NULL,
  last_error text,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);

-- Poison messages, kept whole with their last error so they can be inspected and replayed.
CREATE TABLE {{schema}}.inbox_parked (
  consumer   text        NOT NULL,
  message_id text        NOT NULL,
  topic      text,
  type       text,
  body       text        NOT NULL,
  headers    jsonb       NOT NULL DEFAULT '{}'::jsonb,
  attempts   integer     NOT NULL,
  last_error text,
  parked_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);
