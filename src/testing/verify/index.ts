/**
 * `idem verify` as a library: run intents with faults against an API and check exactly-once.
 */
export { type EffectCounter, type ListEffectsOptions, listEffects, sqlEffects } from "./effects.ts";
export { type CheckResult, type EffectCounts, type Violation, ViolationKind } from "./invariants.ts";
export {
  DELIVERIES,
  FAULTS,
  type IntentPlan,
  PROBES,
  planIntents,
  type VerifyDelivery,
  type VerifyFault,
  type VerifyProbe,
} from "./plan.ts";
export {
  type Exchange,
  type FaultProxy,
  type FaultProxyOptions,
  type ProxyFault,
  ReplyFate,
  startFaultProxy,
} from "./proxy.ts";
export { formatReport, type VerifyReport } from "./report.ts";
export type { Answer, IntentRun, VerifyOutcome } from "./run.ts";
export { PLACEHOLDERS, type Placeholder, type RequestTemplate, type TemplateVars } from "./template.ts";
export { checkOptions, EffectCountError, type VerifyOptions, VerifyUsageError, verify } from "./verify.ts";
