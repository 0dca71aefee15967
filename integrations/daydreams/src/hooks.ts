/** The @daydreamsai/core hooks this package relies on, and the version it was
 * tested with.
 *
 * 0.3.22 gives extensions no run hooks, so the extension's `install(agent)`
 * replaces `agent.run` (`agent.send` and every input subscription call it). Per
 * run it relies on: `run` taking a `model` (it wins over the context's and the
 * agent's) and `handlers.onLogStream` (called with each finished log entry,
 * starting with the run's `run` entry), and on `agent.logger.on` (Daydreams logs
 * "Step execution failed" there with the context id). Another version is used
 * only after checking the first two at every run: a run whose model calls did
 * not reach the run's model, or whose entries did not reach its handler, fails
 * with a HooksChanged error saying so. */

import { createRequire } from "node:module";

import { StreamExportError } from "./errors.js";

export const TESTED_VERSION = "0.3.22";

/** The installed @daydreamsai/core version ("unknown" if it does not say). */
export function installedVersion(): string {
  try {
    const require = createRequire(import.meta.url);
    return (require("@daydreamsai/core/package.json") as { version?: string }).version ?? "unknown";
  } catch {
    return "unknown";
  }
}

/** The error for a version whose hooks no longer do what 0.3.22's did. */
export function hooksChanged(version: string, what: string): StreamExportError {
  return new StreamExportError(
    `@daydreamsai/core ${version} changed the hooks stream-export relies on: ${what} ` +
      `(tested with ${TESTED_VERSION}); the run was not recorded as it ran`,
    "hooks_changed",
  );
}

/** What is wrong with a finished run's use of the hooks, if anything: whether
 * the run's entries reached its handler, and whether every step that prompted
 * the model (Daydreams sets a step's `data.prompt` just before its call) called
 * the run's model. */
export function hookProblem(
  sawRun: boolean,
  calls: number,
  logs: readonly { ref: string; data?: unknown }[],
): string | undefined {
  if (!sawRun && logs.length > 0) return "agent.run no longer passes log entries to handlers.onLogStream";
  const prompted = logs.filter(
    (log) => log.ref === "step" && typeof (log.data as { prompt?: unknown } | undefined)?.prompt === "string",
  ).length;
  if (prompted > calls) {
    return `agent.run no longer calls the run's own model (${prompted} model calls, ${calls} through the gateway)`;
  }
  return undefined;
}
