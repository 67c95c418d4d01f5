-- wrk script of the comparison: POST the payment, with an Idempotency-Key chosen by the mode.
--   wrk ... -s load.lua URL -- <mode> <prefix> [replay keys]
--   bare:    no key
--   keyed:   a new key on every request (<prefix>-<thread>-<n>), so every request runs for the first time
--   replay:  the keys <prefix>-0 .. <prefix>-(N-1), completed before the slice, over and over
-- done() prints one line of JSON for the bench to read.

wrk.method = "POST"
wrk.body = '{"amount_cents":5000,"currency":"eur"}'
wrk.headers["Content-Type"] = "application/json"

local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

local mode, prefix, nkeys
local n = 0

function init(args)
  mode = args[1] or "bare"
  prefix = args[2] or "k"
  nkeys = tonumber(args[3] or "256")
  if mode == "keyed" then prefix = prefix .. "-" .. tid .. "-" end
  if mode == "replay" then n = tid * 7 end
end

function request()
  n = n + 1
  if mode == "keyed" then
    wrk.headers["Idempotency-Key"] = prefix .. n
  elseif mode == "replay" then
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. (n % nkeys)
  end
  return wrk.format()
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
