/**
 * The errors idem throws (issue 21), as a caller who catches them sees them: each names its class (in
 * logs and `instanceof`-free checks), has its stable code, HTTP status and message, keeps its cause,
 * and is recognised by its own type guard only. Also: the URL redaction used in log lines.
 */
import { describe, expect, it } from "vitest";
import {
  AbandonedWorkError,
  AmbiguousBodyError,
  IdemError,
  InvalidBodyError,
  isIdemError,
  isKeyInFlightError,
  isKeyMismatchError,
  isLeaseLostError,
  isOperationUncertainError,
  isRetryableError,
  KeyInFlightError,
  KeyInvalidError,
  KeyMismatchError,
  KeyMissingError,
  LeaseLostError,
  OperationUncertainError,
  ProblemCode,
  RetryableError,
  redactUrl,
} from "../../src/core/index.ts";

const cause = new Error("the provider timed out");

describe("idem's errors", () => {
  it("each names its class and carries its code, status and message", () => {
    const cases: Array<[IdemError, string, string, number, string]> = [
      [
        new KeyMissingError(),
        "KeyMissingError",
        "idempotency-key-missing",
        400,
        "This endpoint requires an Idempotency-Key header (a UUID is recommended).",
      ],
      [
        new KeyInvalidError("it is empty"),
        "KeyInvalidError",
        "idempotency-key-invalid",
        400,
        "The Idempotency-Key header is invalid: it is empty.",
      ],
      [
        new KeyInFlightError(3),
        "KeyInFlightError",
        "idempotency-key-in-flight",
        409,
        "A request with this Idempotency-Key is still in progress; retry with the same key later.",
      ],
      [
        new KeyMismatchError(),
        "KeyMismatchError",
        "idempotency-key-mismatch",
        422,
        "This Idempotency-Key was already used with a different request; use a new key for a new request.",
      ],
      [
        new LeaseLostError(),
        "LeaseLostError",
        "idempotency-lease-lost",
        409,
        "Our lease on this key expired and another worker took over; stopping.",
      ],
      [new RetryableError("try again"), "RetryableError", "retryable-failure", 503, "try again"],
      [
        new OperationUncertainError("op_1"),
        "OperationUncertainError",
        "operation-uncertain",
        409,
        "This operation started a call to another system whose outcome is unknown; do not retry it, with this key or a new one: give the operation_ref to support.",
      ],
      [new AmbiguousBodyError("twice"), "AmbiguousBodyError", "ambiguous-body", 400, "twice"],
      [new InvalidBodyError("not JSON"), "InvalidBodyError", "invalid-body", 400, "not JSON"],
      [new IdemError(ProblemCode.NotFound, 404, "no such key"), "IdemError", "not-found", 404, "no such key"],
    ];
    for (const [err, name, code, status, message] of cases) {
      expect(err).toBeInstanceOf(IdemError);
      expect(err).toBeInstanceOf(Error);
      expect({ name: err.name, code: err.code, status: err.status, message: err.message }).toEqual({
        name,
        code,
        status,
        message,
      });
      expect(String(err)).toBe(`${name}: ${message}`);
    }
  });

  it("a speculative work whose key was taken is told so, by name", () => {
    const err = new AbandonedWorkError();
    expect(err).not.toBeInstanceOf(IdemError); // the handler's statements reject with it; let it propagate
    expect(String(err)).toBe(
      "AbandonedWorkError: this request's key was already taken: its statements were rolled back and its answer is not used",
    );
  });

  it("keep their cause and what the caller needs next (Retry-After, the operation_ref)", () => {
    const retry = new RetryableError("later", { cause, retryAfterSeconds: 7 });
    expect(retry.cause).toBe(cause);
    expect(retry.retryAfterSeconds).toBe(7);
    expect(new RetryableError("later", { cause }).retryAfterSeconds).toBe(1);
    expect(new KeyInFlightError(4).retryAfterSeconds).toBe(4);
    const uncertain = new OperationUncertainError("op_2", "the bank did not answer", { cause });
    expect(uncertain.operationRef).toBe("op_2");
    expect(uncertain.message).toBe("the bank did not answer");
    expect(uncertain.cause).toBe(cause);
    expect(new IdemError("x", 500, "y", { cause }).cause).toBe(cause);
  });

  it("the type guards recognise their own error only", () => {
    const errs = {
      inFlight: new KeyInFlightError(1),
      mismatch: new KeyMismatchError(),
      leaseLost: new LeaseLostError(),
      uncertain: new OperationUncertainError("op"),
      retryable: new RetryableError("r"),
      plain: new Error("not ours"),
    };
    const guards = {
      inFlight: isKeyInFlightError,
      mismatch: isKeyMismatchError,
      leaseLost: isLeaseLostError,
      uncertain: isOperationUncertainError,
      retryable: isRetryableError,
    };
    for (const [name, guard] of Object.entries(guards)) {
      for (const [which, err] of Object.entries(errs)) {
        expect(guard(err), `${name}(${which})`).toBe(name === which);
      }
      expect(guard(undefined)).toBe(false);
    }
    for (const [which, err] of Object.entries(errs)) expect(isIdemError(err), which).toBe(which !== "plain");
    expect(isIdemError({ code: "idempotency-key-missing", status: 400 })).toBe(false);
  });
});

describe("URLs in log lines", () => {
  it("never show a password, and a string that is not a URL is not echoed", () => {
    expect(redactUrl("amqp://relay:s3cret@mq.internal:5672/vhost")).toBe(
      "amqp://relay:***@mq.internal:5672/vhost",
    );
    expect(redactUrl("postgres://app@db:5432/pay")).toBe("postgres://app@db:5432/pay");
    expect(redactUrl("s3cret-pasted-here")).toBe("(an unparsable URL)");
  });
});
