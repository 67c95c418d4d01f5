/**
 * AWS Lambda's HTTP events and proxy results, read and written without the AWS SDK: API Gateway REST
 * (payload 1.0), HTTP API and Function URLs (payload 2.0), and Application Load Balancer targets. The
 * shapes are structural subsets of `@types/aws-lambda`'s (`APIGatewayProxyEvent`, `APIGatewayProxyEventV2`,
 * `ALBEvent` and their results), so those types are accepted as they are and nothing here needs them.
 *
 * One event becomes the lifecycle's request (method, path with query, headers, the body's bytes); a
 * `StoredResponse` becomes the result the event's source expects. The body is written as text when it is
 * UTF-8 of a textual content type, else base64 (`isBase64Encoded`): the choice depends on the bytes
 * only, so a replay's result is the first one's, byte for byte.
 */
import type { IdemRequest, StoredResponse } from "../core/index.ts";

type Headers = Record<string, string | undefined> | null;
type Query = Record<string, string | undefined> | null;
type MultiQuery = Record<string, string[] | undefined> | null;

/** API Gateway REST API (payload 1.0), the fields idem reads. */
export interface RestApiEvent {
  httpMethod: string;
  path: string;
  headers?: Record<string, string | undefined> | null;
  multiValueHeaders?: Record<string, string[] | undefined> | null;
  queryStringParameters?: Record<string, string | undefined> | null;
  multiValueQueryStringParameters?: Record<string, string[] | undefined> | null;
  body: string | null;
  isBase64Encoded: boolean;
  requestContext: object;
}

/** HTTP API and Lambda Function URL (payload 2.0), the fields idem reads. */
export interface HttpApiEvent {
  version: string;
  rawPath: string;
  rawQueryString: string;
  headers: Record<string, string | undefined>;
  cookies?: string[];
  body?: string;
  isBase64Encoded: boolean;
  requestContext: { http: { method: string } };
}

/** Application Load Balancer target (with or without multi-value headers), the fields idem reads. */
export interface AlbEvent {
  httpMethod: string;
  path: string;
  headers?: Record<string, string | undefined>;
  multiValueHeaders?: Record<string, string[] | undefined>;
  queryStringParameters?: Record<string, string | undefined>;
  multiValueQueryStringParameters?: Record<string, string[] | undefined>;
  body: string | null;
  isBase64Encoded: boolean;
  requestContext: { elb: { targetGroupArn: string } };
}

/** Any HTTP event idem/lambda serves. */
export type LambdaHttpEvent = RestApiEvent | HttpApiEvent | AlbEvent;

/** The proxy result of REST APIs and ALB targets (`APIGatewayProxyResult`, `ALBResult`). */
export interface ProxyResult {
  statusCode: number;
  statusDescription?: string;
  headers?: Record<string, string | number | boolean>;
  multiValueHeaders?: Record<string, Array<string | number | boolean>>;
  body?: string;
  isBase64Encoded?: boolean;
}

/** The structured result of HTTP APIs and Function URLs (`APIGatewayProxyStructuredResultV2`). */
export interface ProxyResultV2 {
  statusCode?: number;
  headers?: Record<string, string | number | boolean>;
  cookies?: string[];
  body?: string;
  isBase64Encoded?: boolean;
}

/** What a handler returns: the result its event's source takes (both shapes are read the same way). */
export type LambdaReply = ProxyResult | ProxyResultV2;

/** Which of the three formats an event is in. */
export type EventFormat = "rest" | "http" | "alb";

export function formatOf(event: LambdaHttpEvent): EventFormat {
  if ((event as HttpApiEvent).version === "2.0") return "http";
  const context = event.requestContext as { elb?: unknown } | undefined;
  return context?.elb ? "alb" : "rest";
}

/** An HTTP event as the lifecycle's request: headers by lower-case name (repeated ones joined). */
export class EventRequest implements IdemRequest {
  readonly method: string;
  readonly path: string;
  readonly headers = new Map<string, string>();
  readonly format: EventFormat;
  /** The ALB event came with multi-value headers (then the result must use them too). */
  readonly multiValue: boolean;

  constructor(event: LambdaHttpEvent) {
    this.format = formatOf(event);
    if (this.format === "http") {
      const e = event as HttpApiEvent;
      this.method = e.requestContext.http.method;
      this.path = e.rawQueryString ? `${e.rawPath}?${e.rawQueryString}` : e.rawPath;
      this.add(e.headers);
      // Payload 2.0 moves Cookie headers to `cookies`: put them back for scope and authorization.
      if (e.cookies?.length) this.headers.set("cookie", e.cookies.join("; "));
      this.multiValue = false;
    } else {
      const e = event as RestApiEvent | AlbEvent;
      this.method = e.httpMethod;
      // REST APIs hand decoded query values; ALB hands them as they came on the wire.
      const encode = this.format === "rest" ? encodeURIComponent : (s: string) => s;
      this.path = e.path + queryOf(e.multiValueQueryStringParameters, e.queryStringParameters, encode);
      this.multiValue = e.multiValueHeaders != null;
      // Both maps when the source sends both (REST APIs); a repeated header is whole in the multi one.
      this.add(e.headers);
      for (const [name, values] of Object.entries(e.multiValueHeaders ?? {})) {
        if (values?.length) this.headers.set(name.toLowerCase(), values.join(", "));
      }
    }
  }

  private add(headers: Headers | undefined): void {
    if (!headers) return;
    for (const [name, value] of Object.entries(headers)) {
      if (value !== undefined) this.headers.set(name.toLowerCase(), value);
    }
  }

  header(name: string): string | undefined {
    return this.headers.get(name.toLowerCase());
  }
}

function queryOf(
  multi: MultiQuery | undefined,
  single: Query | undefined,
  encode: (s: string) => string,
): string {
  const parts: string[] = [];
  if (multi) {
    for (const [k, values] of Object.entries(multi))
      for (const v of values ?? []) parts.push(`${encode(k)}=${encode(v)}`);
  } else if (single) {
    for (const [k, v] of Object.entries(single)) if (v !== undefined) parts.push(`${encode(k)}=${encode(v)}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

const encoder = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** The body's bytes as sent (base64 decoded when the source says so). */
export function bodyOf(event: LambdaHttpEvent): Uint8Array {
  const body = event.body;
  if (body == null || body === "") return new Uint8Array(0);
  return event.isBase64Encoded ? Buffer.from(body, "base64") : encoder.encode(body);
}

/** A handler's result as the lifecycle's response: header names lower-cased, cookies as Set-Cookie. */
export function storedOf(reply: LambdaReply): StoredResponse {
  const headers: Array<[string, string]> = [];
  const multi = (reply as ProxyResult).multiValueHeaders;
  const single = reply.headers ?? {};
  const seen = new Set<string>();
  if (multi) {
    for (const [name, values] of Object.entries(multi)) {
      seen.add(name.toLowerCase());
      for (const v of values) headers.push([name.toLowerCase(), String(v)]);
    }
  }
  for (const [name, v] of Object.entries(single)) {
    if (!seen.has(name.toLowerCase())) headers.push([name.toLowerCase(), String(v)]);
  }
  for (const cookie of (reply as ProxyResultV2).cookies ?? []) headers.push(["set-cookie", cookie]);
  const body = reply.body ?? "";
  return {
    status: reply.statusCode ?? 200,
    headers,
    body: reply.isBase64Encoded ? Buffer.from(body, "base64") : encoder.encode(body),
  };
}

const TEXTUAL = /^(text\/|application\/([\w.+-]*\+)?(json|xml|x-www-form-urlencoded|javascript)\b)/i;

/** The body as the result carries it: text when it is UTF-8 of a textual type, else base64. */
function encodeBody(r: StoredResponse): { body: string; isBase64Encoded: boolean } {
  if (r.body.length === 0) return { body: "", isBase64Encoded: false };
  const type = r.headers.find(([n]) => n.toLowerCase() === "content-type")?.[1] ?? "";
  if (TEXTUAL.test(type)) {
    try {
      return { body: strictUtf8.decode(r.body), isBase64Encoded: false };
    } catch {
      // not UTF-8 after all: base64 below
    }
  }
  return { body: Buffer.from(r.body).toString("base64"), isBase64Encoded: true };
}

/** HTTP reason phrases for ALB's `statusDescription` (which it requires); others get none. */
const REASONS: Record<number, string> = {
  200: "OK",
  201: "Created",
  202: "Accepted",
  204: "No Content",
  400: "Bad Request",
  401: "Unauthorized",
  402: "Payment Required",
  403: "Forbidden",
  404: "Not Found",
  409: "Conflict",
  413: "Content Too Large",
  422: "Unprocessable Content",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
};

/** The response as the result the request's source expects. */
export function resultOf(request: EventRequest, r: StoredResponse): ProxyResult | ProxyResultV2 {
  const { body, isBase64Encoded } = encodeBody(r);
  if (request.format === "http") {
    const headers: Record<string, string> = {};
    const cookies: string[] = [];
    for (const [name, value] of r.headers) {
      const n = name.toLowerCase();
      if (n === "set-cookie") cookies.push(value);
      else headers[n] = n in headers ? `${headers[n]}, ${value}` : value;
    }
    const result: ProxyResultV2 = { statusCode: r.status, headers, body, isBase64Encoded };
    if (cookies.length) result.cookies = cookies;
    return result;
  }
  const result: ProxyResult = { statusCode: r.status, body, isBase64Encoded };
  if (request.format === "alb") {
    result.statusDescription = `${r.status} ${REASONS[r.status] ?? ""}`.trim();
  }
  if (request.format === "rest" || request.multiValue) {
    const multi: Record<string, string[]> = {};
    for (const [name, value] of r.headers) append(multi, name.toLowerCase(), value);
    result.multiValueHeaders = multi;
  } else {
    // ALB without multi-value headers: one value per name (repeats joined; only the first Set-Cookie).
    const headers: Record<string, string> = {};
    for (const [name, value] of r.headers) {
      const n = name.toLowerCase();
      if (!(n in headers)) headers[n] = value;
      else if (n !== "set-cookie") headers[n] = `${headers[n]}, ${value}`;
    }
    result.headers = headers;
  }
  return result;
}

/** Add a value to a name's list. */
function append(lists: Record<string, string[]>, name: string, value: string): void {
  const list = lists[name];
  if (list) list.push(value);
  else lists[name] = [value];
}
