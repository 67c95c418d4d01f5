/**
 * The receiver on every framework, over real HTTP: Hono, Express, Fastify, node:http, a Web handler
 * (Next.js route shape) and NestJS on Express and on Fastify. Each takes the raw bytes before any
 * parser; each answers a duplicate 200 with one effect and a tampered body 401; and a setup whose
 * parser ran first (Express's json() in front, Fastify's JSON parser, Nest without rawBody) answers
 * 500 with the fix, never "signature mismatch".
 */
import "reflect-metadata";
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Controller, type INestApplication, Module, Post, Req, Res } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { FastifyAdapter } from "@nestjs/platform-fastify";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import { beforeEach, describe, expect, it } from "vitest";
import type { Db } from "../../src/postgres/db.ts";
import { type WebhookReceiver, webhookReceiver } from "../../src/webhooks/receiver.ts";
import { stripeScheme } from "../../src/webhooks/stripe.ts";
import { backends } from "../helpers/db.ts";
import {
  effectCount,
  logEffect,
  paymentIntentEvent,
  STRIPE_SECRET,
  stripeDelivery,
  useWebhookDb,
} from "./senders.ts";

type Started = { url: string; close(): Promise<void> };

function listening(server: Server): Promise<Started> {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo;
      resolve({
        url: `http://127.0.0.1:${port}`,
        close: () => new Promise<void>((r) => server.close(() => r())),
      });
    });
  });
}

/** Each framework's app with the receiver on POST /webhooks/stripe; `parsedFirst`: a JSON parser in front. */
const frameworks: Record<string, (r: WebhookReceiver<unknown>, parsedFirst: boolean) => Promise<Started>> = {
  hono: async (r, parsedFirst) => {
    const app = new Hono();
    app.use("/webhooks/*", async (c, next) => {
      // Hono's own c.req.json() keeps the text it read (the receiver uses it); reading the raw
      // request behind Hono's back leaves nothing to verify.
      if (parsedFirst) await c.req.raw.json();
      else await c.req.json();
      await next();
    });
    app.post("/webhooks/stripe", r.hono());
    const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as Server;
    await new Promise((ok) => server.once("listening", ok));
    const { port } = server.address() as AddressInfo;
    return {
      url: `http://127.0.0.1:${port}`,
      close: () => new Promise<void>((ok) => server.close(() => ok())),
    };
  },
  express: async (r, parsedFirst) => {
    const app = express();
    if (parsedFirst) app.use(express.json());
    app.post("/webhooks/stripe", r.express());
    app.use(express.json()); // after the webhook route: the rest of the app parses JSON as usual
    return listening(createServer(app));
  },
  fastify: async (r, parsedFirst) => {
    const app = Fastify();
    if (parsedFirst) app.post("/webhooks/stripe", r.fastifyHandler);
    else await app.register(r.fastify, { path: "/webhooks/stripe" });
    app.post("/other", async (req) => req.body); // JSON parsing elsewhere is untouched
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
  },
  node: async (r, parsedFirst) =>
    listening(
      createServer(async (req: IncomingMessage, res: ServerResponse) => {
        if (parsedFirst) for await (const _ of req); // something read the stream
        if (req.method === "POST" && req.url === "/webhooks/stripe") return r.node(req, res);
        res.writeHead(404).end();
      }),
    ),
  web: async (r, parsedFirst) => {
    // A Next.js route handler's shape: `export const POST = receiver.fetch`, served by a Web server.
    const readFirst = async (req: Request) => {
      await req.text(); // something read the body before the receiver
      return r.fetch(req);
    };
    const POST = parsedFirst ? readFirst : r.fetch;
    const server = serve({ fetch: (req) => POST(req), port: 0, hostname: "127.0.0.1" }) as Server;
    await new Promise((ok) => server.once("listening", ok));
    const { port } = server.address() as AddressInfo;
    return {
      url: `http://127.0.0.1:${port}`,
      close: () => new Promise<void>((ok) => server.close(() => ok())),
    };
  },
  "nest-express": (r, parsedFirst) => nestApp(r, { rawBody: !parsedFirst, fastify: false }),
  "nest-fastify": (r, parsedFirst) => nestApp(r, { rawBody: !parsedFirst, fastify: true }),
};

async function nestApp(
  receiver: WebhookReceiver<unknown>,
  o: { rawBody: boolean; fastify: boolean },
): Promise<Started> {
  @Controller("webhooks")
  class WebhooksController {
    @Post("stripe")
    receive(@Req() req: unknown, @Res() res: unknown) {
      return receiver.nest(req, res);
    }
  }
  @Module({ controllers: [WebhooksController] })
  class AppModule {}
  const options = { rawBody: o.rawBody, logger: false as const };
  const app: INestApplication = o.fastify
    ? await NestFactory.create(AppModule, new FastifyAdapter(), options)
    : await NestFactory.create(AppModule, options);
  await app.listen(0, "127.0.0.1");
  return {
    url: `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`,
    close: () => app.close(),
  };
}

describe.each(backends.slice(0, 1).concat(backends.slice(1, 2)))("webhook adapters on $name", (backend) => {
  const database = useWebhookDb(backend);
  let db: Db;
  beforeEach(() => {
    db = database();
  });

  const receiverFor = (consumer: string, errors: Error[] = []) =>
    webhookReceiver({
      db,
      consumer,
      scheme: stripeScheme({ secret: STRIPE_SECRET }),
      onError: (err) => errors.push(err),
      handler: async (event, { tx }) => {
        await logEffect(tx, consumer, event.id);
      },
    });

  describe.each(Object.keys(frameworks))("%s", (name) => {
    it("reads the raw body: applied once, redelivery 200 duplicate, tampered body 401", async () => {
      const consumer = `${name}-${randomUUID()}`;
      const app = await frameworks[name]!(receiverFor(consumer), false);
      try {
        // Stripe's body has spaces and newlines a JSON parser would not keep.
        const event = paymentIntentEvent(
          `evt_${consumer}`,
          "pi_1",
          "succeeded",
          Math.floor(Date.now() / 1000),
        );
        const d = stripeDelivery(JSON.stringify(event, null, 2));
        const post = (body = d.body) =>
          fetch(`${app.url}/webhooks/stripe`, { method: "POST", headers: d.headers, body });
        const first = await post();
        expect(first.status).toBe(200);
        expect(await first.json()).toMatchObject({ result: "applied", id: event.id });
        const again = await post();
        expect(await again.json()).toMatchObject({ result: "duplicate" });
        expect((await post(d.body.replace("5000", "50"))).status).toBe(401);
        expect(await effectCount(db, consumer)).toBe(1);
      } finally {
        await app.close();
      }
    });

    it("a parser that ran first answers 500 saying how to fix it, never a signature mismatch", async () => {
      const consumer = `${name}-${randomUUID()}`;
      const errors: Error[] = [];
      const app = await frameworks[name]!(receiverFor(consumer, errors), true);
      try {
        const d = stripeDelivery(
          paymentIntentEvent(`evt_${consumer}`, "pi_1", "succeeded", Math.floor(Date.now() / 1000)),
        );
        const res = await fetch(`${app.url}/webhooks/stripe`, {
          method: "POST",
          headers: d.headers,
          body: d.body,
        });
        expect(res.status).toBe(500);
        expect(res.headers.get("content-type")).toBe("application/problem+json");
        const problem = (await res.json()) as { type: string; detail: string };
        expect(problem.type).toBe("urn:idem:problem:webhook-body-parsed");
        expect(problem.detail).not.toMatch(/signature/i);
        const fix = {
          express: /express\.json\(\)/,
          fastify: /app\.register\(receiver\.fastify/,
          "nest-express": /rawBody: true/,
          "nest-fastify": /rawBody: true/,
        };
        expect(problem.detail).toMatch(fix[name as keyof typeof fix] ?? /before/);
        expect(errors.map((e) => e.name)).toEqual(["WebhookBodyParsedError"]);
        expect(await effectCount(db, consumer)).toBe(0);
      } finally {
        await app.close();
      }
    });
  });
});
