/**
 * The OpenAPI document at /openapi.json: it is a valid OpenAPI 3.1 document (checked by the Python
 * `openapi-spec-validator` where the machine has it, and by a structural check here in any case), it names
 * every route the service serves, keyed POSTs declare the Idempotency-Key header as required with the
 * retention window, and the replies the service really sends match what it declares (status, headers,
 * body schema, checked with ajv against the document's own JSON Schemas).
 */
import { execFileSync, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiKeys } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { openApiDocument } from "../../app/openapi.ts";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

type Json = Record<string, any>;
const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const METHODS = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/** Resolve a local `$ref` (`#/components/...`) against the document. */
function resolve(doc: Json, ref: string): unknown {
  if (!ref.startsWith("#/")) return undefined;
  let at: any = doc;
  for (const part of ref.slice(2).split("/")) {
    at = at?.[part.replace(/~1/g, "/").replace(/~0/g, "~")];
    if (at === undefined) return undefined;
  }
  return at;
}
const deref = (doc: Json, v: Json): Json =>
  v && typeof v.$ref === "string" ? deref(doc, resolve(doc, v.$ref) as Json) : v;

function* walk(v: unknown, path = "#"): Generator<[string, Json]> {
  if (Array.isArray(v)) for (const [i, x] of v.entries()) yield* walk(x, `${path}/${i}`);
  else if (v && typeof v === "object") {
    yield [path, v as Json];
    for (const [k, x] of Object.entries(v)) yield* walk(x, `${path}/${k}`);
  }
}

const hasPython = spawnSync("python3", ["-c", "import openapi_spec_validator"]).status === 0;

describe("the OpenAPI document", () => {
  let svc: RunningService;
  let doc: Json;
  let ajv: Ajv2020;

  /** The document's JSON Schema for a reply, with its `$ref`s pointed at the registered components. */
  const validatorFor = (schema: Json) => {
    const rewritten = JSON.parse(
      JSON.stringify(schema).replaceAll('"#/components/schemas/', '"urn:idem:schemas#/$defs/'),
    );
    return ajv.compile(rewritten);
  };

  beforeAll(async () => {
    svc = await startService(backend, { paymentsMode: "phases", playground: true });
    const res = await fetch(`${svc.url}/openapi.json`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    doc = (await res.json()) as Json;
    ajv = new Ajv2020({
      strict: true,
      formats: { "date-time": (s: string) => !Number.isNaN(Date.parse(s)) },
    });
    const defs = JSON.parse(
      JSON.stringify(doc.components.schemas).replaceAll(
        '"#/components/schemas/',
        '"urn:idem:schemas#/$defs/',
      ),
    );
    ajv.addSchema({ $id: "urn:idem:schemas", $defs: defs });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it.skipIf(!hasPython)("passes openapi-spec-validator (the official OpenAPI 3.1 schema)", () => {
    const file = join(mkdtempSync(join(tmpdir(), "idem-oas-")), "openapi.json");
    writeFileSync(file, JSON.stringify(doc));
    const out = execFileSync(
      "python3",
      [
        "-c",
        "import json,sys\nfrom openapi_spec_validator import validate\nvalidate(json.load(open(sys.argv[1])))\nprint('valid')",
        file,
      ],
      { encoding: "utf8" },
    );
    expect(out.trim()).toBe("valid");
  });

  it("has the structure of an OpenAPI 3.1 document, and every $ref resolves", () => {
    expect(doc.openapi).toMatch(/^3\.1\.\d+$/);
    expect(doc.info.title).toBeTruthy();
    expect(doc.info.version).toBeTruthy();
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: "http", scheme: "bearer" });
    const operationIds = new Set<string>();
    for (const [path, item] of Object.entries<Json>(doc.paths)) {
      expect(path.startsWith("/")).toBe(true);
      const templated = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
      for (const method of Object.keys(item)) {
        expect(METHODS).toContain(method);
        const op = item[method] as Json;
        expect(op.operationId, `${method} ${path}`).toBeTruthy();
        expect(operationIds.has(op.operationId), `duplicate operationId ${op.operationId}`).toBe(false);
        operationIds.add(op.operationId);
        const codes = Object.keys(op.responses ?? {});
        expect(codes.length, `${method} ${path} has no responses`).toBeGreaterThan(0);
        for (const code of codes) expect(code).toMatch(/^([1-5]\d\d|default)$/);
        for (const r of Object.values<Json>(op.responses)) expect(deref(doc, r).description).toBeTruthy();
        const params = (op.parameters ?? []).map((p: Json) => deref(doc, p));
        for (const p of params) {
          expect(["query", "header", "path", "cookie"]).toContain(p.in);
          if (p.in === "path") expect(p.required).toBe(true);
        }
        const inPath = params.filter((p: Json) => p.in === "path").map((p: Json) => p.name);
        expect(inPath.sort(), `${method} ${path}: path parameters`).toEqual([...templated].sort());
        expect(op["x-idempotency"], `${method} ${path}: x-idempotency`).toBeTruthy();
      }
    }
    for (const [where, node] of walk(doc)) {
      if (typeof node.$ref === "string") {
        expect(resolve(doc, node.$ref), `${where}: ${node.$ref} does not resolve`).toBeDefined();
      }
    }
  });

  it("names every route the service serves (and no route it does not)", () => {
    const app = createApp({
      db: svc.open.db,
      store: svc.store,
      apiKeys: new ApiKeys(svc.open.db),
      paymentsMode: "phases",
      providerUrl: svc.providerUrl,
      playground: true,
    });
    const served = new Set(
      app.routes
        .filter(
          (r) =>
            r.method !== "ALL" &&
            !(r.method === "GET" && (r.path === "/" || /\.(js|css|svg|ico)$/.test(r.path))), // static files
        )
        .map((r) => `${r.method.toLowerCase()} ${r.path.replace(/:([A-Za-z_]+)/g, "{$1}")}`),
    );
    const documented = new Set(
      Object.entries<Json>(doc.paths).flatMap(([p, item]) => Object.keys(item).map((m) => `${m} ${p}`)),
    );
    expect([...documented].sort()).toEqual([...served].sort());
  });

  it("keyed POSTs require the Idempotency-Key header and publish the retention window", () => {
    const retentionSeconds = svc.store.retentionMs / 1000;
    const keyedOps = Object.entries<Json>(doc.paths).flatMap(([p, item]) =>
      Object.entries<Json>(item)
        .filter(([, op]) => op["x-idempotency"]?.required)
        .map(([m, op]) => [`${m} ${p}`, op] as const),
    );
    expect(keyedOps.map(([name]) => name).sort()).toEqual(
      ["post /v1/checkouts", "post /v1/orders", "post /v1/payments", "post /v1/payments/{id}/refunds"].sort(),
    );
    for (const [name, op] of keyedOps) {
      const header = (op.parameters as Json[])
        .map((p) => deref(doc, p))
        .find((p) => p.name === "Idempotency-Key");
      expect(header, name).toMatchObject({ in: "header", required: true });
      expect(header!.schema).toMatchObject({ type: "string", minLength: 1, maxLength: 255 });
      expect(new RegExp(header!.schema.pattern).test("8e03978e-40d5-43e8-bc93-6894a57f9324")).toBe(true);
      expect(new RegExp(header!.schema.pattern).test("has space")).toBe(false);
      expect(header!.description).toMatch(/sf-string/);
      expect(op["x-idempotency"]).toEqual({
        required: true,
        retentionSeconds,
        replayHeader: "Idempotent-Replayed",
        // Phases payments: the server's 5 s bound; atomic routes: the store's duplicate wait.
        answerWithinSeconds: name === "post /v1/payments" ? 5 : svc.store.lockTimeoutMs / 1000,
      });
      for (const code of ["400", "401", "409", "413", "415", "422"]) {
        const r = deref(doc, op.responses[code]);
        expect(r.content?.["application/problem+json"]?.schema, `${name} ${code}`).toEqual({
          $ref: "#/components/schemas/Problem",
        });
      }
      const created = deref(doc, op.responses["201"] ?? op.responses["202"]); // 202: a checkout, placed
      expect(Object.keys(created.headers)).toEqual(
        expect.arrayContaining(["Idempotency-Expires", "Idempotent-Replayed"]),
      );
      expect(deref(doc, op.responses["409"]).headers["Retry-After"]).toBeTruthy();
    }
    expect(doc.info.description).toContain("24 hours");
    // Reads take no key.
    expect(doc.paths["/v1/payments"].get["x-idempotency"].required).toBe(false);
    expect(doc.paths["/v1/payments"].get.parameters).toBeUndefined();
  });

  it("follows the store's retention and the service's mode", () => {
    const short = openApiDocument({ retentionMs: 2 * 3_600_000 }) as Json;
    expect(short.paths["/v1/payments"].post["x-idempotency"].retentionSeconds).toBe(7200);
    expect(short.info.description).toContain("2 hours");
    expect(short.paths["/playground/api/pay"]).toBeUndefined();
    const atomic = openApiDocument({
      retentionMs: 3_600_000,
      paymentsMode: "atomic",
      requireKey: false,
    }) as Json;
    expect(atomic.paths["/v1/payments"].post["x-idempotency"].required).toBe(false);
    expect(atomic.paths["/v1/payments"].post.responses["402"]).toBeUndefined();
    expect(atomic.paths["/v1/payments"].post.responses["409"]).toEqual({
      $ref: "#/components/responses/InFlight",
    });
    const slowLock = openApiDocument({ retentionMs: 3_600_000, lockTimeoutMs: 12_000 }) as Json;
    expect(slowLock.paths["/v1/orders"].post["x-idempotency"].answerWithinSeconds).toBe(12);
    expect(slowLock.paths["/v1/payments"].post["x-idempotency"].answerWithinSeconds).toBe(5);
  });

  it("publishes the client/server contract: operation state, retry advice, the answer bound", () => {
    const problem = doc.components.schemas.Problem as Json;
    expect(problem.properties.operation_state).toMatchObject({
      type: "string",
      enum: ["none", "in_progress", "done", "failed_not_applied", "uncertain"],
    });
    expect(problem.properties.retry_same_key).toMatchObject({ type: "boolean" });
    expect(problem.properties.safe_new_key).toMatchObject({ type: "boolean" });
    expect(problem.properties.operation_ref).toMatchObject({ type: "string" });
    const validate = validatorFor({ $ref: "#/components/schemas/Problem" });
    const base = { type: "urn:idem:problem:operation-uncertain", title: "t", status: 409 };
    expect(validate({ ...base, operation_state: "uncertain", operation_ref: "op_x" })).toBe(true);
    expect(validate({ ...base, operation_state: "maybe" })).toBe(false);
    expect(validate({ ...base, retry_same_key: "no" })).toBe(false);

    const headers = doc.components.headers as Json;
    expect(headers["Idempotency-Operation-State"].schema.enum).toEqual(
      problem.properties.operation_state.enum,
    );
    expect(headers["Idempotency-Answer-Within"].schema).toMatchObject({ type: "integer" });
    const payments = doc.paths["/v1/payments"].post as Json;
    const conflict = deref(doc, payments.responses["409"]);
    expect(conflict.description).toContain("urn:idem:problem:operation-uncertain");
    expect(conflict.description).toContain("urn:idem:problem:idempotency-key-in-flight");
    // Every reply of a keyed operation may carry the answer bound; its problems also the state.
    for (const [path, item] of Object.entries<Json>(doc.paths)) {
      for (const [method, op] of Object.entries<Json>(item)) {
        if (!op["x-idempotency"].required) {
          expect(op["x-idempotency"].answerWithinSeconds, `${method} ${path}`).toBeNull();
          continue;
        }
        expect(op["x-idempotency"].answerWithinSeconds).toBeGreaterThan(0);
        for (const [code, r] of Object.entries<Json>(op.responses)) {
          if (code === "401" || code === "413" || code === "415") continue; // answered before the key is read
          const reply = deref(doc, r);
          expect(Object.keys(reply.headers ?? {}), `${method} ${path} ${code}`).toContain(
            "Idempotency-Answer-Within",
          );
          if (reply.content?.["application/problem+json"])
            expect(Object.keys(reply.headers), `${method} ${path} ${code}`).toContain(
              "Idempotency-Operation-State",
            );
        }
      }
    }
  });

  it("declares the request schemas the server validates with: it accepts what they accept", async () => {
    const declared = (doc.paths["/v1/payments"].post as Json).requestBody.content["application/json"].schema;
    const validate = validatorFor(declared);
    const schema = deref(doc, declared);
    const bodies: unknown[] = [
      { amount_cents: 1, currency: "eur" },
      { amount_cents: 100_000_000, currency: "usd", card: "4242424242424242" },
      { amount_cents: 10, currency: "eur", card: null },
      { amount_cents: 0, currency: "eur" },
      { amount_cents: 100_000_001, currency: "eur" },
      { amount_cents: 5.5, currency: "eur" },
      { amount_cents: "5", currency: "eur" },
      { amount_cents: 5, currency: "EUR" },
      { amount_cents: 5 },
      { currency: "eur" },
      { amount_cents: 5, currency: "eur", card: "not a card!" },
      { amount_cents: 5, currency: "eur", card: "x".repeat(65) },
    ];
    for (const body of bodies) {
      const res = await pay(svc.url, { key: `"${randomUUID()}"`, body: JSON.stringify(body) });
      const answer = (await res.json()) as Json;
      if (validate(body)) expect(res.status, JSON.stringify(body)).toBe(201);
      else {
        expect(res.status, JSON.stringify(body)).toBe(400);
        expect(answer.type).toBe("urn:idem:problem:invalid-body");
        // The detail names the field and its rule (the same schema's `description`).
        const [field] = /amount_cents|currency|card/.exec(answer.detail) ?? [];
        expect(field, answer.detail).toBeTruthy();
        expect(answer.detail).toBe(
          `Invalid payment: ${field} must be ${schema.properties[field!].description}.`,
        );
      }
    }
    // The form body is documented with the same schema, and is served.
    expect(
      (doc.paths["/v1/payments"].post as Json).requestBody.content["application/x-www-form-urlencoded"]
        .schema,
    ).toEqual(declared);
    const form = await pay(svc.url, {
      key: `"${randomUUID()}"`,
      body: "amount_cents=1200&currency=eur&card=4242424242424242",
      contentType: "application/x-www-form-urlencoded",
    });
    expect(form.status).toBe(201);
    const twice = await pay(svc.url, {
      key: `"${randomUUID()}"`,
      body: "amount_cents=5000&amount_cents=100&currency=eur",
      contentType: "application/x-www-form-urlencoded",
    });
    expect(twice.status).toBe(400);
    expect((await twice.json()).detail).toBe("Invalid payment: amount_cents is given more than once.");
  });

  it("every reply the service sends to POST /v1/payments is one the document declares", async () => {
    const op = doc.paths["/v1/payments"].post as Json;
    const check = async (res: Response, expectHeaders: string[] = []) => {
      const declared = deref(doc, op.responses[String(res.status)] ?? {});
      expect(declared.description, `status ${res.status} is not declared`).toBeTruthy();
      const type = (res.headers.get("content-type") ?? "").split(";")[0]!;
      const media = declared.content?.[type];
      expect(media, `${res.status} ${type} is not declared`).toBeTruthy();
      const body = await res.json();
      const validate = validatorFor(media.schema);
      expect(validate(body), JSON.stringify(validate.errors)).toBe(true);
      for (const [name, h] of Object.entries<Json>(declared.headers ?? {})) {
        const header = deref(doc, h);
        const value = res.headers.get(name);
        if (header.required) expect(value, `${res.status}: header ${name}`).toBeTruthy();
        if (value !== null && header.schema) {
          // A header the server sends must match its declared schema (integers arrive as text).
          const typed = header.schema.type === "integer" ? Number(value) : value;
          expect(ajv.validate(header.schema, typed), `${res.status}: ${name}: ${value}`).toBe(true);
        }
      }
      for (const name of expectHeaders) expect(Object.keys(declared.headers ?? {})).toContain(name);
      return body;
    };
    const body = JSON.stringify({ amount_cents: 1500, currency: "eur" });
    const key = `"${randomUUID()}"`;

    const first = await pay(svc.url, { key, body });
    expect(first.status).toBe(201);
    const made = await check(first);
    const again = await pay(svc.url, { key, body });
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(deref(doc, doc.components.headers["Idempotent-Replayed"]).schema.enum).toEqual(["true"]);
    expect(await check(again, ["Idempotent-Replayed"])).toEqual(made);

    const mismatch = await pay(svc.url, {
      key,
      body: JSON.stringify({ amount_cents: 1501, currency: "eur" }),
    });
    expect(mismatch.status).toBe(422);
    await check(mismatch);
    const missing = await pay(svc.url, { body });
    expect(missing.status).toBe(400);
    await check(missing);
    const invalid = await pay(svc.url, { key: "has space", body });
    expect(invalid.status).toBe(400);
    await check(invalid);
    const unauth = await pay(svc.url, { key: `"${randomUUID()}"`, body, apiKey: "sk_nope" });
    expect(unauth.status).toBe(401);
    await check(unauth);
    const tooBig = await pay(svc.url, {
      key: `"${randomUUID()}"`,
      body: JSON.stringify({ pad: "x".repeat(20_000) }),
    });
    expect(tooBig.status).toBe(413);
    await check(tooBig);
    const media = await pay(svc.url, { key: `"${randomUUID()}"`, body: "x", contentType: "text/plain" });
    expect(media.status).toBe(415);
    await check(media);
    const declined = await pay(svc.url, {
      key: `"${randomUUID()}"`,
      body: JSON.stringify({ amount_cents: 100, currency: "eur", card: "4000000000000002" }),
    });
    expect(declined.status).toBe(402);
    await check(declined);

    // In flight: the playground's slow worker holds the key's lease; the public route answers 409.
    const slowKey = randomUUID();
    const slow = fetch(`${svc.url}/playground/api/pay`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key: slowKey, amount_cents: 1600, fault: "slow-worker" }),
    });
    let busy: Response | undefined;
    for (let i = 0; i < 50 && !busy; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const k = await svc.store.inspect("acct_demo_1", slowKey);
      if (k?.recoveryPoint === "charged")
        busy = await pay(svc.url, {
          key: `"${slowKey}"`,
          body: JSON.stringify({ amount_cents: 1600, currency: "eur" }),
        });
    }
    expect(busy?.status).toBe(409);
    await check(busy!);
    expect(Number(busy!.headers.get("retry-after"))).toBeGreaterThan(0);
    await slow;
  });

  it("is served with the key format the server really accepts", async () => {
    const op = doc.paths["/v1/payments"].post as Json;
    const schema = deref(doc, op.parameters[0]).schema as Json;
    const validate = ajv.compile(schema);
    const body = JSON.stringify({ amount_cents: 10, currency: "eur" });
    for (const key of ["a", "x".repeat(255), "abc~!#$%&'*+-.^_`|"]) {
      expect(validate(key), key).toBe(true);
      expect((await pay(svc.url, { key, body })).status, key).toBe(201);
    }
    for (const key of ["x".repeat(256), "with space"]) {
      expect(validate(key), key).toBe(false);
      expect((await pay(svc.url, { key, body })).status, key).toBe(400);
    }
  });
});
