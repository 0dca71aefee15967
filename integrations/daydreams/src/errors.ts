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
  const text =
    error instanceof Error ? `${error.name}: ${error.message}` : `error: ${String(error)}`;
  return text.slice(0, 1000);
}
