/**
 * `idem/testing`: tools to prove exactly-once behaviour under failure. A payment-provider simulator
 * (`startProvider`, and a classifying client `chargeProvider`), crash points for phases runners
 * (`crashAt`, `randomCrashes`, `pauseAt`), and a seeded generator.
 */
export { SimulatedCrashError } from "../postgres/phases/index.ts";
export { type CountingFaults, crashAt, pauseAt, randomCrashes } from "./faults.ts";
export {
  type Charge,
  type FaultRates,
  type Provider,
  type ProviderFault,
  type ProviderOptions,
  startProvider,
} from "./provider.ts";
export {
  type ChargeRequest,
  type ChargeResult,
  chargeProvider,
  findCharges,
  listCharges,
} from "./provider-client.ts";
export type { Refund } from "./provider-refunds.ts";
export type { ProviderWebhookOptions, ProviderWebhookStats, ProviderWebhooks } from "./provider-webhooks.ts";
export {
  type StagingFaultOptions,
  type StagingFaults,
  StagingFaultsInProductionError,
  stagingFaults,
  stagingFaultsFromEnv,
} from "./staging.ts";
export {
  type CheckResult,
  EffectCountError,
  type EffectCounter,
  type EffectCounts,
  type Exchange,
  type FaultProxy,
  type FaultProxyOptions,
  formatReport,
  type ListEffectsOptions,
  listEffects,
  type ProxyFault,
  ReplyFate,
  type RequestTemplate,
  sqlEffects,
  startFaultProxy,
  type TemplateVars,
  type VerifyDelivery,
  type VerifyFault,
  type VerifyOptions,
  type VerifyOutcome,
  type VerifyProbe,
  type VerifyReport,
  VerifyUsageError,
  type Violation,
  ViolationKind,
  verify,
} from "./verify/index.ts";
