/**
 * The operations console: its page (console/index.html, console.js, look.css and console.css: no framework, no build
 * step) and the admin API, as one fetch handler mounted at one path. The page holds no data: it asks for
 * an admin token and calls the API beside it with it (`Authorization: Bearer`, never a cookie, so no
 * other site can act through a visitor's browser).
 *
 *   GET {base}             the page        GET {base}/console.js, {base}/look.css, {base}/console.css   its script and style
 *   {base}/api/*           adminHandler (every request passes `authorize`)
 *
 * `(request: Request) => Promise<Response>` mounts on any adapter that speaks the Fetch API (Hono's
 * `app.all`, Next.js, Bun, Deno); `toNodeListener` makes it a node:http listener for node:http, Express
 * and Fastify.
 */
import { readFile } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { type AdminHandler, type AdminHandlerOptions, adminHandler, adminProblem } from "./handler.ts";

/** Options of {@link adminConsole}: the admin API's, with the path the console is mounted at. */
export interface AdminConsoleOptions extends Omit<AdminHandlerOptions, "basePath"> {
  /** Where the page is; the API is under `{basePath}/api`. Default: `/admin`. */
  basePath?: string;
}

const ASSETS: Record<string, [file: string, type: string]> = {
  "": ["index.html", "text/html; charset=utf-8"],
  "/console.js": ["console.js", "text/javascript; charset=utf-8"],
  "/console.css": ["console.css", "text/css; charset=utf-8"],
  "/look.css": ["look.css", "text/css; charset=utf-8"],
};

const HEADERS = {
  "cache-control": "no-store",
  // The page runs only its own script and talks only to its own origin.
  "content-security-policy":
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
};

/** The console's page and API as one fetch handler. */
export function adminConsole(options: AdminConsoleOptions): AdminHandler {
  const base = (options.basePath ?? "/admin").replace(/\/$/, "");
  const api = adminHandler({ ...options, basePath: `${base}/api` });
  const files = new Map<string, Promise<Uint8Array>>();
  const asset = (name: string) => {
    let file = files.get(name);
    if (!file) {
      file = readFile(new URL(`./console/${name}`, import.meta.url)).then((bytes) =>
        // The page names its script and style under the base it is served at.
        name === "index.html"
          ? new TextEncoder().encode(bytes.toString("utf8").replaceAll("{{BASE}}", base))
          : bytes,
      );
      file.catch(() => files.delete(name));
      files.set(name, file);
    }
    return file;
  };
  return async (request, info) => {
    const path = new URL(request.url).pathname;
    if (path === `${base}/api` || path.startsWith(`${base}/api/`)) return api(request, info);
    const rest = path.startsWith(base) ? path.slice(base.length).replace(/^\/$/, "") : undefined;
    const found = rest === undefined ? undefined : ASSETS[rest];
    if (!found) return adminProblem(404, "not-found", `No admin page at ${path}.`);
    if (request.method !== "GET" && request.method !== "HEAD") {
      return adminProblem(405, "method-not-allowed", `${path} takes GET.`, { allow: "GET, HEAD" });
    }
    const [name, type] = found;
    const body = await asset(name);
    return new Response(request.method === "HEAD" ? null : (body as Uint8Array<ArrayBuffer>), {
      headers: { ...HEADERS, "content-type": type },
    });
  };
}

/**
 * A fetch handler as a node:http listener (node:http, Express's `app.use`, Fastify's raw request):
 * the request's method, URL (`req.originalUrl` under Express, so a mount path stays), headers and body
 * go in; the response's status, headers and body come out.
 */
export function toNodeListener(
  handler: (request: Request) => Promise<Response>,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const fail = (err: unknown) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
      res.end(String((err as Error)?.message ?? err));
    };
    (async () => {
      const url = new URL(
        (req as { originalUrl?: string }).originalUrl ?? req.url ?? "/",
        `http://${req.headers.host ?? "localhost"}`,
      );
      const headers = new Headers();
      for (const [name, value] of Object.entries(req.headers)) {
        if (value === undefined) continue;
        for (const v of Array.isArray(value) ? value : [value]) headers.append(name, v);
      }
      const chunks: Buffer[] = [];
      if (req.method !== "GET" && req.method !== "HEAD")
        for await (const chunk of req) chunks.push(chunk as Buffer);
      const response = await handler(
        new Request(url, {
          method: req.method ?? "GET",
          headers,
          ...(chunks.length ? { body: Buffer.concat(chunks) } : {}),
        }),
      );
      res.writeHead(response.status, Object.fromEntries(response.headers));
      res.end(Buffer.from(await response.arrayBuffer()));
    })().catch(fail);
  };
}
