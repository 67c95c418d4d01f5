/**
 * The reference service for bench/soak.ts: `start()` of app/main.ts in a process of its own, which
 * tells its parent its URL and, when asked ("memory"), its heap after a forced collection and its RSS.
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { start } from "../app/main.ts";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const svc = await start(process.env);
process.send?.({ url: `http://127.0.0.1:${svc.port}` });
process.on("message", (m) => {
  if (m !== "memory") return;
  gc();
  gc();
  const { heapUsed, rss } = process.memoryUsage();
  process.send?.({ heapMB: heapUsed / 2 ** 20, rssMB: rss / 2 ** 20 });
});
process.once("SIGTERM", () => {
  svc.stop().then(() => process.exit(0));
});
process.once("disconnect", () => {
  svc.stop().then(() => process.exit(0));
});
