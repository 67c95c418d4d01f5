-- Messaging, second part: an index for the ordered relay's claim, and the inbox partitioned by time.

-- Unpublished events in flight, backing off or parked: with per-aggregate ordering, the relay's claim
-- skips their aggregates. Few rows at any time (published rows and waiting rows are not in it).
CREATE INDEX outbox_held ON {{schema}}.outbox (aggregate_id)
  WHERE published_at IS NULL AND aggregate_id IS NOT NULL
    AND (parked_at IS NOT NULL OR locked_until IS NOT NULL);

-- The inbox, partitioned by time like the keys: dedup marks past their retention go a partition at a
-- time (DETACH CONCURRENTLY, then DROP), not by a row-by-row DELETE. A mark's bucket is
-- floor(processed time / partition width), the width being the keys' (settings.partition_seconds).
-- PostgreSQL's unique indexes are per partition, so the inbox looks a message up in every partition
-- before marking it, and a mark made early in a partition also goes into the previous one, so that two
-- copies processed at once on either side of a boundary still meet on one unique index (see inbox.ts).
--
-- The existing table becomes the first partition (every bucket before now's), kept until its newest
-- mark is past retention like any other; its processed_at index is no longer needed.
DROP INDEX {{schema}}.inbox_processed_at;
ALTER TABLE {{schema}}.inbox RENAME TO inbox_unpartitioned;
ALTER TABLE {{schema}}.inbox_unpartitioned DROP CONSTRAINT inbox_pkey; -- ATTACH builds the partition's own
CREATE TABLE {{schema}}.inbox (
  bucket       integer     NOT NULL,
  consumer     text        NOT NULL,
  message_id   text        NOT NULL,
  status       text        NOT NULL DEFAULT 'done',
  processed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id, bucket)
) PARTITION BY RANGE (bucket);
DO $$
DECLARE
  b integer := floor(extract(epoch FROM now()) / (SELECT partition_seconds FROM {{schema}}.settings))::integer;
BEGIN
  EXECUTE format('ALTER TABLE {{schema}}.inbox_unpartitioned ADD COLUMN bucket integer NOT NULL DEFAULT %s', b - 1);
  EXECUTE format('ALTER TABLE {{schema}}.inbox_unpartitioned RENAME TO inbox_b%s', b - 1);
  EXECUTE format('ALTER TABLE {{schema}}.inbox ATTACH PARTITION {{schema}}.inbox_b%s FOR VALUES FROM (MINVALUE) TO (%s)', b - 1, b);
END $$;

-- Parked outbox events, for the parked-events gauge (few rows: they wait for someone to requeue them).
CREATE INDEX outbox_parked ON {{schema}}.outbox (parked_at)
  WHERE parked_at IS NOT NULL AND published_at IS NULL;
