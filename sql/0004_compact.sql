-- Compact storage (a per-route option of atomic mode): instead of the whole reply, a key row may keep
-- only its status and the id of the resource the request created. `headers` and `body` stay NULL and
-- a replay is rebuilt from (status, resource_id) by the route's `compact.rebuild`, usually by reading
-- the resource again. Rows saved in full leave this column NULL. Adding a nullable column without a
-- default only changes the catalog: no partition is rewritten.
ALTER TABLE {{schema}}.keys ADD COLUMN resource_id text;
