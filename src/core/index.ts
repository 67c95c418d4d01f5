export * from "./engine.ts";
export * from "./errors.ts";
export * from "./fingerprint.ts";
export * from "./key.ts";
export * from "./problem.ts";
export * from "./response.ts";
export * from "./store.ts";
