/**
 * `idem verify` as a library: run intents with faults against an API and check exactly-once.
 */
export { type EffectCounter, type ListEffectsOptions, listEffects, sqlEffects } from "./effects.ts";
export { type CheckResult, type EffectCounts, type Violation, ViolationKind } from "./invariants.ts";
export {
  DELIVERIES,
  type Delivery,
  FAULTS,
  type Fault,
  type IntentPlan,
  PROBES,
  type Probe,
  planIntents,
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
export type { Answer, IntentRun, Outcome } from "./run.ts";
export { PLACEHOLDERS, type Placeholder, type RequestTemplate, type TemplateVars } from "./template.ts";
export { checkOptions, EffectCountError, type VerifyOptions, VerifyUsageError, verify } from "./verify.ts";
