/**
 * `idem/observability`: how idem's OpenTelemetry spans show scopes and keys. Everything else needs no
 * setup: with `@opentelemetry/api` installed and a provider registered by the application (its SDK),
 * idem's spans and metrics appear in the application's traces (README, "Observability").
 */
export { configureTelemetry, type KeyForm, type TelemetryOptions } from "./keys.ts";
