// Loaded with `node --import` before the MCP conformance suite on Node.js older than 22.
//
// The suite's bundle imports `globSync` from `fs`, which Node.js has only from 22 on; on 20 the
// import fails before any scenario runs. Only its `tier-check` command calls it (to read a
// results folder), never the `server` command these tests run, so the bundle's `fs` is served
// by a module with all of `node:fs` plus a `globSync` that says why it is missing.
import { isMainThread } from "node:worker_threads";
import { register } from "node:module";

const SHIM =
  "data:text/javascript," +
  encodeURIComponent(
    'export * from "node:fs"; export { default } from "node:fs";' +
      'export function globSync() { throw new Error("fs.globSync needs Node.js 22 or later"); }',
  );

export async function resolve(specifier, context, next) {
  const fromSuite = context.parentURL?.includes("/node_modules/conformance-") ?? false;
  if (fromSuite && (specifier === "fs" || specifier === "node:fs")) {
    return { url: SHIM, shortCircuit: true };
  }
  return next(specifier, context);
}

// Imported by `--import` on the main thread: install this file's `resolve` as a loader hook
// (which loads it again on the hooks thread, where it only exports the hook).
const major = Number(process.versions.node.split(".")[0]);
if (isMainThread && major < 22) register(import.meta.url);
