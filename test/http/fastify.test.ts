/**
 * The Fastify 5 adapter: route hooks from `idempotency(options)`, and the same hooks as a plugin.
 */
import { randomUUID } from "node:crypto";
import Fastify, { type FastifyReply, type FastifyRequest, type preValidationAsyncHookHandler } from "fastify";
import { describe, expect, it } from "vitest";
import { idempotency, idempotencyPlugin, idempotentPhases } from "../../src/http/fastify.ts";
import { backends } from "../helpers/db.ts";
import {
  type AppParts,
  account,
  charge,
  INVALID_BODY,
  mayReplay,
  PHASED_ANSWER_WITHIN_MS,
  paymentOf,
  paymentsContract,
  useApp,
  validatePayment,
} from "./contract.ts";
import { lifecycleContract } from "./contract-lifecycle.ts";

const validate: preValidationAsyncHookHandler = async function validate(request, reply) {
  if (typeof validatePayment(request.body) === "string") {
    return reply.code(400).type("application/problem+json").send(INVALID_BODY);
  }
};

async function pay(request: FastifyRequest, reply: FastifyReply) {
  const { tx, scope, body } = request.idempotency;
  const header = (name: string) => request.headers[name] as string | undefined;
  const r = await charge(tx, scope, body, header);
  return reply
    .code(r.status)
    .header("location", r.location)
    .header("set-cookie", r.cookie)
    .type("application/json")
    .send(r.json);
}

async function startFastify({ store, runner }: AppParts) {
  const app = Fastify();
  const scope = (request: FastifyRequest) => request.headers["x-account"] as string | undefined;
  const authorizeReplay = (request: FastifyRequest) =>
    mayReplay((name) => request.headers[name] as string | undefined);
  app.post(
    "/v1/payments",
    { preValidation: validate, ...idempotency({ store, scope, authorizeReplay }) },
    pay,
  );
  app.post("/v1/phased", {
    preValidation: validate,
    ...idempotentPhases({
      runner,
      scope,
      authorizeReplay,
      input: (_request, body) => paymentOf(body),
      answerWithinMs: PHASED_ANSWER_WITHIN_MS,
    }),
  });
  app.post("/v1/tips", { preValidation: validate, ...idempotency({ store, scope, required: false }) }, pay);
  await app.register(
    async (scoped) => {
      await scoped.register(idempotencyPlugin, { store, scope });
      scoped.post("/payments", { preValidation: validate }, pay);
    },
    { prefix: "/plugin" },
  );
  app.post("/v1/unkeyed", async () => ({ ok: true })); // beside the plugin's prefix: not affected by it
  // A handler that takes the response over (hijack) and writes it itself: onSend never runs.
  app.post("/v1/hijacked", { ...idempotency({ store, scope }) }, async (request, reply) => {
    const { tx, scope: owner, body } = request.idempotency;
    await charge(tx, owner, body, (name) => request.headers[name] as string | undefined);
    reply.hijack();
    reply.raw.writeHead(201, { "content-type": "application/json" }).end('{"hijacked":true}');
  });
  await app.register(async (notes) => {
    // A parser in the style of raw-body: it listens for data and end and never calls resume().
    notes.addContentTypeParser("text/plain", (_request, payload, done) => {
      let text = "";
      payload.on("data", (chunk: Buffer) => {
        text += chunk.toString();
      });
      payload.on("end", () => done(null, text));
    });
    notes.post("/v1/notes", { ...idempotency({ store, scope }) }, async (request, reply) =>
      reply.code(201).send({ note: request.body, seen: Date.now() + Math.random() }),
    );
  });
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { url, close: () => app.close() };
}

describe.each(backends)("Fastify adapter on $name", (backend) => {
  const app = useApp(backend, startFastify);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);

  it("applies the plugin to the routes of its prefix only", async () => {
    const acct = account();
    const key = randomUUID();
    const first = await app.post("/plugin/payments", { account: acct, key });
    expect(first.status).toBe(201);
    const retry = await app.post("/plugin/payments", { account: acct, key });
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.text()).toBe(await first.text());
    expect((await app.post("/plugin/payments", { account: acct })).status).toBe(400);
    const outside = await app.post("/v1/unkeyed", { account: acct });
    expect(outside.status).toBe(200);
    expect(await app.rows(acct)).toBe(1);
  });

  it("rolls back a hijacked reply, which idem never sees, and runs its retry again", async () => {
    const acct = account();
    const key = randomUUID();
    for (let i = 0; i < 3; i++) {
      const res = await app.post("/v1/hijacked", { account: acct, key });
      expect(res.status).toBe(201);
      expect(await res.text()).toBe('{"hijacked":true}');
      expect(res.headers.get("idempotent-replayed")).toBeNull();
    }
    // Each run claimed the key only once the one before had ended: the first two rolled back, and
    // kept nothing (the third may still be ending).
    expect(await app.rows(acct)).toBe(0);
  });

  it("answers and replays a route whose own parser reads the body with a data listener only", async () => {
    const acct = account();
    const key = randomUUID();
    const note = (body: string) =>
      app.post("/v1/notes", { account: acct, key, body, headers: { "content-type": "text/plain" } });
    const first = await note("pay the rent");
    expect(first.status).toBe(201);
    const sent = await first.json();
    expect(sent.note).toBe("pay the rent");
    const retry = await note("pay the rent");
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.json()).toEqual(sent);
    expect((await note("pay the bills")).status).toBe(422);
  });
});
