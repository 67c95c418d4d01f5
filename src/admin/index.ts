/**
 * `idem/admin`: the operations a person supporting the service performs (find a key by the
 * `operation_ref` a customer pastes, its story, settle or forget it; parked outbox events and inbox
 * messages; the audit), every change recorded in `<schema>.admin_actions`; and a framework-free admin
 * API over them (`adminHandler`, Request in, Response out) with an `authorize` hook.
 */

export type { ConsumerParkedMessage } from "../messaging/inbox-admin.ts";
export { parkedMessages, unparkMessage } from "../messaging/inbox-admin.ts";
export type { ParkedEvent } from "../messaging/outbox-admin.ts";
export { outboxLag, parkedEvents } from "../messaging/outbox-admin.ts";
export type { AdminAction, NewAdminAction } from "../postgres/admin/admin-actions.ts";
export { listActions, recordAction } from "../postgres/admin/admin-actions.ts";
export type { AuditCheck, AuditResult } from "../postgres/admin/audit.ts";
export type { KeyRef, KeyStory, TimelineEvent } from "../postgres/admin/key-admin.ts";
export {
  BadOperationRefError,
  expiringKeys,
  findKey,
  forgetKey,
  InvalidKeyRefError,
  keyStory,
} from "../postgres/admin/key-admin.ts";
export {
  CannotForgetError,
  type ForgetBy,
  type ForgetFacts,
  type ForgetVerdict,
  forgetVerdict,
} from "../postgres/admin/key-forget.ts";
export type { KeyEvent, KeyEventKind } from "../postgres/phases/history.ts";
export { type AdminConsoleOptions, adminConsole, toNodeListener } from "./console.ts";
export {
  type AdminHandler,
  type AdminHandlerOptions,
  type AdminRequestInfo,
  type Authorize,
  adminHandler,
  adminProblem,
} from "./handler.ts";
export { type AuditRun, type KeyListState, Operations, type OperationsOptions } from "./operations.ts";
export type { AuthLimitOptions } from "./throttle.ts";
export { bearerTokens, parseAdminTokens } from "./tokens.ts";
