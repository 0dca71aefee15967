/** The gateway's session API: start an episode, add steps to it, end it.
 *
 * Requests the gateway refused before recording anything (503 with Retry-After:
 * Kafka away, outboxes full; 429) are sent again, and so are requests that never
 * reached it. A batch of steps carries its number in the episode (0, 1, ...), so
 * sending it again after a lost answer records it once; an end is answered again
 * while the episode is open. A start is sent again only when the gateway surely
 * did not start it (a refusal, a refused connection): a second start would leave
 * an episode nobody ends. */

import { StreamExportError } from "./errors.js";

export type Outcome = "success" | "failure" | "other";
/** The contract's step kinds an agent reports itself (the gateway records `llm_call`). */
export type StepKind = "observation" | "thought" | "action" | "action_result" | "output" | "message";

/** A step as the steps route takes it: the contract's step without its envelope
 * (episode, seq and time are the gateway's). */
export interface StepIn {
  kind: StepKind;
  content: string;
  name?: string;
  arguments?: Record<string, unknown>;
  data?: unknown;
  id?: string;
}

export interface EpisodeStartIn {
  agent_id: string;
  prompt: string;
  group_id?: string;
  group_size?: number;
  metadata?: Record<string, unknown>;
}

export interface EpisodeEndIn {
  outcome: Outcome;
  reward?: number | null;
  metadata?: Record<string, unknown>;
}

export interface Started {
  episode_id: string;
  base_url: string;
}

type Retry = "transient" | "refused";

const ATTEMPTS = 6;
const FIRST_BACKOFF_MS = 250;
const MAX_BACKOFF_MS = 4000;

export class Session {
  constructor(
    readonly gateway: string,
    readonly apiKey: string | undefined,
    readonly timeoutMs: number,
  ) {}

  /** POST /v1/episodes: the new episode's id and the base URL its calls use. */
  async start(body: EpisodeStartIn): Promise<Started> {
    return (await this.post("/v1/episodes", body, "refused")) as Started;
  }

  /** POST /v1/episodes/{id}/steps: the episode's ``batch``-th batch of steps,
   * recorded after every call the episode made before it. */
  async steps(episodeId: string, batch: number, steps: StepIn[]): Promise<void> {
    try {
      await this.post(`/v1/episodes/${episodeId}/steps`, { batch, steps }, "transient");
    } catch (error) {
      if (error instanceof StreamExportError && error.code === "http_404") {
        throw new StreamExportError(
          `the gateway at ${this.gateway} has no steps route (POST /v1/episodes/{id}/steps): ` +
            "it is older than this package",
          "no_steps_route",
          404,
        );
      }
      throw error;
    }
  }

  /** POST /v1/episodes/{id}/end. */
  async end(episodeId: string, body: EpisodeEndIn): Promise<void> {
    await this.post(`/v1/episodes/${episodeId}/end`, body, "transient", true);
  }

  private async post(
    path: string,
    body: unknown,
    retry: Retry,
    endOnce = false,
  ): Promise<unknown> {
    let backoff = FIRST_BACKOFF_MS;
    for (let attempt = 1; ; attempt++) {
      let wait: number | undefined;
      try {
        const answer = await this.send(path, body);
        if (answer.ok) return await answer.json();
        const error = await refusal(answer);
        // A repeated end whose first answer was lost: the gateway closed it already.
        if (endOnce && attempt > 1 && answer.status === 404) return {};
        if (answer.status !== 503 && answer.status !== 429) throw error;
        if (attempt === ATTEMPTS) throw error;
        wait = retryAfterMs(answer) ?? backoff;
      } catch (error) {
        if (error instanceof StreamExportError) throw error;
        const sure = refusedConnection(error);
        if (attempt === ATTEMPTS || (retry === "refused" && !sure)) {
          throw new StreamExportError(
            `cannot reach the gateway at ${this.gateway} (${path}): ${describe(error)}`,
            "unreachable",
          );
        }
      }
      await new Promise((resolve) => setTimeout(resolve, wait ?? backoff));
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  private send(path: string, body: unknown): Promise<Response> {
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    return fetch(this.gateway.replace(/\/+$/, "") + path, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
  }
}

/** The gateway's OpenAI-shaped error as a StreamExportError. */
async function refusal(answer: Response): Promise<StreamExportError> {
  const text = await answer.text();
  let message = text.slice(0, 500);
  let code = `http_${answer.status}`;
  try {
    const error = (JSON.parse(text) as { error?: { message?: string; code?: string } }).error;
    if (error?.message) message = error.message;
    if (error?.code) code = error.code;
  } catch {
    // not JSON: an older gateway's bare 404, a proxy's page
  }
  return new StreamExportError(`the gateway answered ${answer.status}: ${message}`, code, answer.status);
}

function retryAfterMs(answer: Response): number | undefined {
  const seconds = Number(answer.headers.get("Retry-After"));
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds, 10) * 1000 : undefined;
}

/** Whether fetch failed before the request could reach the gateway. */
function refusedConnection(error: unknown): boolean {
  const cause = (error as { cause?: { code?: string } } | undefined)?.cause;
  return cause?.code === "ECONNREFUSED";
}

function describe(error: unknown): string {
  const cause = (error as { cause?: unknown } | undefined)?.cause;
  const detail = cause instanceof Error ? `: ${cause.message}` : "";
  return error instanceof Error ? `${error.message}${detail}` : String(error);
}
