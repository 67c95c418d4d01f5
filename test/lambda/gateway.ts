/**
 * A stand-in for what sits in front of a Lambda function (API Gateway REST and HTTP APIs, a Function
 * URL, an Application Load Balancer): an HTTP server on loopback that turns each request into the
 * synthetic event of one of those sources, typed by `@types/aws-lambda`'s shapes, invokes the function
 * with a `Context` whose remaining time runs down from `timeoutMs`, and writes the proxy result back as
 * the source would. The adapter contract suite (test/http/contract.ts) then drives Lambda handlers
 * over HTTP like every other adapter.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import type {
  ALBEvent,
  ALBResult,
  APIGatewayProxyEvent,
  APIGatewayProxyEventV2,
  APIGatewayProxyResult,
  APIGatewayProxyStructuredResultV2,
  Context,
  LambdaFunctionURLEvent,
} from "aws-lambda";

export type Source = "rest" | "http" | "url" | "alb" | "alb-multi";
export type AnyEvent = APIGatewayProxyEvent | APIGatewayProxyEventV2 | LambdaFunctionURLEvent | ALBEvent;
export type AnyResult = APIGatewayProxyResult | APIGatewayProxyStructuredResultV2 | ALBResult;
export type LambdaFn = (event: AnyEvent, context: Context) => Promise<AnyResult>;

/** What a request carries, whichever server received it. */
export interface RawRequest {
  method: string;
  /** Path with query string. */
  url: string;
  /** Header pairs as received (names in any case, repeats kept). */
  headers: Array<[string, string]>;
  body: Uint8Array;
}

/** A Lambda `Context` with `timeoutMs` left at the start of the invocation. */
export function lambdaContext(timeoutMs = 30_000): Context {
  const start = Date.now();
  return {
    callbackWaitsForEmptyEventLoop: true,
    functionName: "payments",
    functionVersion: "$LATEST",
    invokedFunctionArn: "arn:aws:lambda:eu-west-1:123456789012:function:payments",
    memoryLimitInMB: "512",
    awsRequestId: randomUUID(),
    logGroupName: "/aws/lambda/payments",
    logStreamName: "2025/01/01/[$LATEST]0123456789abcdef",
    getRemainingTimeInMillis: () => Math.max(0, timeoutMs - (Date.now() - start)),
    done: () => {},
    fail: () => {},
    succeed: () => {},
  };
}

const TEXT = /^(text\/|application\/([\w.+-]*\+)?(json|xml|x-www-form-urlencoded))/i;

/** The body as the source passes it: text when it is UTF-8 of a textual type, else base64. */
function encodedBody(req: RawRequest): { body: string | null; isBase64Encoded: boolean } {
  if (req.body.length === 0) return { body: null, isBase64Encoded: false };
  const type = req.headers.find(([n]) => n.toLowerCase() === "content-type")?.[1] ?? "";
  if (TEXT.test(type)) {
    try {
      return { body: new TextDecoder("utf-8", { fatal: true }).decode(req.body), isBase64Encoded: false };
    } catch {}
  }
  return { body: Buffer.from(req.body).toString("base64"), isBase64Encoded: true };
}

/** The synthetic event of `source` for a request. */
export function eventOf(source: Source, req: RawRequest): AnyEvent {
  const url = new URL(req.url, "http://gateway.local");
  const { body, isBase64Encoded } = encodedBody(req);
  const single: Record<string, string> = {};
  const multi: Record<string, string[]> = {};
  for (const [name, value] of req.headers) {
    single[name] = value; // the last value, as API Gateway's `headers`
    append(multi, name, value);
  }
  const query: Record<string, string> = {};
  const multiQuery: Record<string, string[]> = {};
  for (const [k, v] of url.searchParams) {
    query[k] = v;
    append(multiQuery, k, v);
  }
  const hasQuery = url.searchParams.size > 0;
  if (source === "http" || source === "url") {
    const lower: Record<string, string> = {};
    let cookies: string[] | undefined;
    for (const [name, value] of req.headers) {
      const n = name.toLowerCase();
      if (n === "cookie") cookies = [...(cookies ?? []), ...value.split(/;\s*/)];
      else lower[n] = n in lower ? `${lower[n]},${value}` : value;
    }
    const event: APIGatewayProxyEventV2 = {
      version: "2.0",
      routeKey: source === "url" ? "$default" : `${req.method} ${url.pathname}`,
      rawPath: url.pathname,
      rawQueryString: url.search.slice(1),
      headers: lower,
      ...(cookies ? { cookies } : {}),
      ...(hasQuery ? { queryStringParameters: query } : {}),
      requestContext: {
        accountId: source === "url" ? "anonymous" : "123456789012",
        apiId: source === "url" ? "abcdefghijklmnop" : "api1234567",
        domainName:
          source === "url"
            ? "abcdefghijklmnop.lambda-url.eu-west-1.on.aws"
            : "api1234567.execute-api.eu-west-1.amazonaws.com",
        domainPrefix: source === "url" ? "abcdefghijklmnop" : "api1234567",
        http: {
          method: req.method,
          path: url.pathname,
          protocol: "HTTP/1.1",
          sourceIp: "127.0.0.1",
          userAgent: lower["user-agent"] ?? "",
        },
        requestId: randomUUID(),
        routeKey: "$default",
        stage: "$default",
        time: new Date().toUTCString(),
        timeEpoch: Date.now(),
      },
      isBase64Encoded,
      ...(body === null ? {} : { body }),
    };
    return event;
  }
  if (source === "alb" || source === "alb-multi") {
    const encoded: Record<string, string> = {};
    const encodedMulti: Record<string, string[]> = {};
    for (const part of url.search.slice(1).split("&").filter(Boolean)) {
      const [k = "", v = ""] = part.split("=");
      encoded[k] = v;
      append(encodedMulti, k, v);
    }
    const lower = Object.fromEntries(Object.entries(single).map(([k, v]) => [k.toLowerCase(), v]));
    const lowerMulti = Object.fromEntries(Object.entries(multi).map(([k, v]) => [k.toLowerCase(), v]));
    const event: ALBEvent = {
      requestContext: {
        elb: { targetGroupArn: "arn:aws:elasticloadbalancing:eu-west-1:123:targetgroup/p/1" },
      },
      httpMethod: req.method,
      path: url.pathname,
      ...(source === "alb"
        ? { headers: lower, queryStringParameters: encoded }
        : { multiValueHeaders: lowerMulti, multiValueQueryStringParameters: encodedMulti }),
      body,
      isBase64Encoded,
    };
    return event;
  }
  const event: APIGatewayProxyEvent = {
    resource: url.pathname,
    path: url.pathname,
    httpMethod: req.method,
    headers: single,
    multiValueHeaders: multi,
    queryStringParameters: hasQuery ? query : null,
    multiValueQueryStringParameters: hasQuery ? multiQuery : null,
    pathParameters: null,
    stageVariables: null,
    body,
    isBase64Encoded,
    requestContext: {
      accountId: "123456789012",
      apiId: "api1234567",
      authorizer: null,
      httpMethod: req.method,
      identity: {
        accessKey: null,
        accountId: null,
        apiKey: null,
        apiKeyId: null,
        caller: null,
        clientCert: null,
        cognitoAuthenticationProvider: null,
        cognitoAuthenticationType: null,
        cognitoIdentityId: null,
        cognitoIdentityPoolId: null,
        principalOrgId: null,
        sourceIp: "127.0.0.1",
        user: null,
        userAgent: null,
        userArn: null,
      },
      path: `/prod${url.pathname}`,
      protocol: "HTTP/1.1",
      requestId: randomUUID(),
      requestTimeEpoch: Date.now(),
      resourceId: "abc123",
      resourcePath: url.pathname,
      stage: "prod",
    },
  };
  return event;
}

/** The HTTP response a source sends for a function's result: status, header pairs, body bytes. */
export function responseOf(result: AnyResult): {
  status: number;
  headers: Array<[string, string]>;
  body: Buffer;
} {
  const r = result as APIGatewayProxyResult & APIGatewayProxyStructuredResultV2;
  const headers: Array<[string, string]> = [];
  const named = new Set<string>();
  for (const [name, values] of Object.entries(r.multiValueHeaders ?? {})) {
    named.add(name.toLowerCase());
    for (const v of values) headers.push([name, String(v)]);
  }
  for (const [name, v] of Object.entries(r.headers ?? {})) {
    if (!named.has(name.toLowerCase())) headers.push([name, String(v)]);
  }
  for (const cookie of r.cookies ?? []) headers.push(["set-cookie", cookie]);
  const body = Buffer.from(r.body ?? "", r.isBase64Encoded ? "base64" : "utf8");
  return { status: r.statusCode ?? 200, headers, body };
}

async function rawOf(req: IncomingMessage): Promise<RawRequest> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const headers: Array<[string, string]> = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2)
    headers.push([req.rawHeaders[i]!, req.rawHeaders[i + 1]!]);
  return { method: req.method ?? "GET", url: req.url ?? "/", headers, body: Buffer.concat(chunks) };
}

/** Serve `functions` (by path) on 127.0.0.1 as `source` would. */
export function startGateway(
  source: Source,
  functions: Record<string, LambdaFn>,
  timeoutMs = 30_000,
): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer(async (req, res) => {
    const raw = await rawOf(req);
    const fn = functions[new URL(raw.url, "http://x").pathname];
    if (!fn) {
      res.statusCode = 404;
      return res.end();
    }
    try {
      const out = responseOf(await fn(eventOf(source, raw), lambdaContext(timeoutMs)));
      res.statusCode = out.status;
      const grouped = new Map<string, string[]>();
      for (const [n, v] of out.headers)
        grouped.set(n.toLowerCase(), [...(grouped.get(n.toLowerCase()) ?? []), v]);
      for (const [n, v] of grouped) res.setHeader(n, v.length === 1 ? v[0]! : v);
      res.end(out.body.length ? out.body : undefined);
    } catch {
      res.statusCode = 502; // what API Gateway answers for a function error
      res.end('{"message": "Internal server error"}');
    }
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      }),
    );
  });
}

/** Add a value to a name's list. */
function append(lists: Record<string, string[]>, name: string, value: string): void {
  const list = lists[name];
  if (list) list.push(value);
  else lists[name] = [value];
}
