/**
 * Telemetry reaches each part of idem through a hook that part exposes (the lifecycle's and the
 * store's in `src/core/observe.ts`, the client's in `src/client/observe.ts`, the relay's and the
 * consumers' in `src/messaging/observe.ts`): none of them imports this folder. `installTelemetry`
 * fills every hook; `idem/observability`, the HTTP adapters and the `idem` command run it when they
 * load. Each observer does nothing until `@opentelemetry/api` is installed and a provider registered.
 */
import { setClientObserver } from "../client/observe.ts";
import { setStoreObserver } from "../core/observe.ts";
import { setMessagingObserver } from "../messaging/observe.ts";
import { clientObserver } from "./client.ts";
import { messagingObserver } from "./messaging.ts";
import { storeObserver } from "./phases.ts";
import { installServerTelemetry } from "./server.ts";

/**
 * Send idem's spans and metrics to OpenTelemetry (when `@opentelemetry/api` is installed): keyed
 * requests, phases mode and the maintenance jobs, the client's calls, the relay and the consumers.
 * Importing `idem/observability` or any HTTP adapter does it; call it yourself in a process that
 * uses neither (a relay worker, a script with the client). Idempotent.
 */
export function installTelemetry(): void {
  installServerTelemetry();
  setStoreObserver(storeObserver);
  setClientObserver(clientObserver);
  setMessagingObserver(messagingObserver);
}
