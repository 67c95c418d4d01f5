-- Messaging, second part: an index for the ordered relay's claim, and the inbox partitioned by time.

-- Unpublished events in flight, backing off or parked: with per-aggregate ordering, the relay's claim
-- skips their aggregates. Few rows at any time (published rows and waiting rows are not in it).
CREATE INDEX outbox_held ON {{schema}}.outbox (aggregate_id)
  WHERE published_at IS NULL AND aggregate_id IS NOT NULL
    AND (parked_at IS NOT NULL OR locked_until IS NOT NULL);
