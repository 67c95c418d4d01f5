/**
 * `idem/observability`: how idem's OpenTelemetry spans show scopes and keys. Everything else needs no
 * setup: with `@opentelemetry/api` installed and a provider registered by the application (its SDK),
 * idem's spans and metrics appear in the application's traces once this entry, an HTTP adapter or the
 * `idem` command is loaded (`installTelemetry`; README, "Observability").
 */
import { installTelemetry } from "./install.ts";

export { installTelemetry } from "./install.ts";
export { configureTelemetry, type KeyForm, type TelemetryOptions } from "./keys.ts";

// Loading `idem/observability` (as a telemetry setup file does for `configureTelemetry`) installs it.
installTelemetry();
