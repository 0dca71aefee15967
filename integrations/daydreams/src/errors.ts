/** Every error this package raises: the gateway refused or could not be reached, or
 * the installed @daydreamsai/core no longer offers the hooks the extension uses. */
export class StreamExportError extends Error {
  override name = "StreamExportError";

  constructor(
    message: string,
    /** The gateway's error code (`episode_not_found`, `invalid_step`, ...), or
     * `unreachable`, `hooks_changed`, `no_model`. */
    readonly code: string,
    /** The gateway's HTTP status, when it answered. */
    readonly status?: number,
  ) {
    super(message);
  }
}

/** One line naming an error (what an episode's end metadata carries). */
export function summary(error: unknown): string {
  return describe(error).slice(0, 1000);
}

function describe(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  // An error part of a model's stream: the server's error body, e.g. {message, type, code}.
  const message = (error as { message?: unknown } | null)?.message;
  if (typeof message === "string") return `error: ${message}`;
  try {
    return `error: ${JSON.stringify(error)}`;
  } catch {
    return `error: ${String(error)}`;
  }
}
