/** One Daydreams run as one episode of the gateway.
 *
 * The episode starts when the run starts (Daydreams reports its `run` entry,
 * before the run's inputs: a run waiting in its context's queue has no episode
 * yet), every model call of the run goes to the episode's base URL, the run's
 * parsed entries are sent as steps between its calls, and the episode ends when
 * the run settles: as a failure when the run threw, when its last model call
 * failed, or when Daydreams reported its last step failed (it catches both and
 * returns as if nothing happened); else with the outcome and reward the user's
 * ``reward`` callback gives (outcome `other`, no reward, without one). A run that
 * throws before it started gets an episode too, ended at once as a failure. */

import type { AnyRef, Handlers, InputRef, OutputRef } from "@daydreamsai/core";

import { StreamExportError, summary } from "./errors.js";
import { runModel } from "./model.js";
import type { EpisodeEndIn, Outcome, Session, Started, StepIn } from "./session.js";
import { StepOrder, stepOf } from "./steps.js";

/** What the callbacks know about a run. */
export interface RunInfo {
  /** The context's type (`dark-room`). */
  context: string;
  /** The context instance's id (`dark-room:north`). */
  contextId: string;
  /** The context's arguments, as the run was given them. */
  args: unknown;
  /** The run's inputs (`agent.send`'s input). */
  inputs: InputRef[];
}

/** A run that has settled: what ``reward`` decides from. */
export interface FinishedRun extends RunInfo {
  episodeId: string;
  /** Every entry of the run (what `agent.run` returns; those reported before it
   * threw, when it did). */
  logs: AnyRef[];
  /** The run's outputs. */
  outputs: OutputRef[];
  /** Why the run failed, if it did (its outcome is then `failure`). */
  error?: unknown;
}

export interface Verdict {
  outcome?: Outcome;
  reward?: number | null;
  metadata?: Record<string, unknown>;
}

export interface EndedEpisode {
  episodeId: string;
  /** The run's context instance (`dark-room:r1`). */
  contextId: string;
  outcome: Outcome;
  reward: number | null;
}

/** How a run's episode is made: what the extension's options give. */
export interface RunSettings {
  session: Session;
  agentId: string;
  apiKey: string | undefined;
  task: (run: RunInfo) => string;
  group: ((run: RunInfo) => { id: string; size?: number } | undefined) | undefined;
  metadata: ((run: RunInfo) => Record<string, unknown>) | undefined;
  reward: ((run: FinishedRun) => Verdict | number | undefined | Promise<Verdict | number | undefined>) | undefined;
  onEpisode: ((episode: EndedEpisode) => void) | undefined;
}

export class RunRecorder {
  private started: Promise<Started> | undefined;
  private readonly order = new StepOrder();
  private batches = 0;
  /** The batch being sent (until the gateway acknowledged it). */
  private pending: StepIn[] | undefined;
  private sending: Promise<void> = Promise.resolve();
  /** Why the run's last model call or step failed (cleared by a later good call). */
  private failure: unknown;
  /** Model calls made through the episode, and whether the run entry was seen:
   * what shows that Daydreams honoured the run's model and handlers. */
  calls = 0;
  sawRun = false;
  /** The finished entries the run reported (what a run that threw leaves). */
  private readonly seen: AnyRef[] = [];

  constructor(
    readonly settings: RunSettings,
    readonly info: RunInfo,
    readonly modelId: string,
    /** Called when Daydreams starts the run (it may wait in its context's queue). */
    private readonly onStart: () => void = () => undefined,
  ) {}

  /** The run's model (see model.ts). */
  model() {
    return runModel(this.modelId, this.settings.apiKey, {
      before: async () => {
        this.calls++;
        const episode = await this.begin();
        await this.send();
        return episode;
      },
      after: (error?: unknown) => {
        this.failure = error;
      },
    });
  }

  /** The run's handlers: the user's, and ours first. */
  handlers(user: Partial<Handlers> | undefined): Partial<Handlers> {
    return {
      ...user,
      onLogStream: (log: AnyRef, done: boolean) => {
        if (done) this.logged(log);
        user?.onLogStream?.(log, done);
      },
    };
  }

  /** Daydreams reported its last step failed (its logger, see index.ts). */
  stepFailed(error: unknown): void {
    this.failure ??= error ?? new Error("a step of the run failed");
  }

  private logged(log: AnyRef): void {
    this.seen.push(log);
    if (log.ref === "run") {
      this.sawRun = true;
      this.onStart();
      void this.begin().catch(() => undefined); // its error reaches the first call
      return;
    }
    const step = stepOf(log);
    if (step) this.order.add(step);
  }

  /** The episode, started once: at the run's start, its first call, or its end. */
  private begin(): Promise<Started> {
    this.started ??= this.settings.session.start({
      agent_id: this.settings.agentId,
      prompt: this.settings.task(this.info),
      ...this.groupFields(),
      metadata: {
        context: this.info.context,
        args: this.info.args as unknown,
        ...this.settings.metadata?.(this.info),
      },
    });
    return this.started;
  }

  private groupFields(): { group_id?: string; group_size?: number } {
    const group = this.settings.group?.(this.info);
    if (!group) return {};
    return group.size === undefined ? { group_id: group.id } : { group_id: group.id, group_size: group.size };
  }

  /** Send the steps reported so far as the episode's next batch (one batch at a
   * time). A batch the gateway did not acknowledge is kept and sent again, the
   * same steps under the same number, before any later step: the gateway may have
   * recorded it, and records a number once. */
  private send(all = false): Promise<void> {
    const next = this.sending.then(async () => {
      for (;;) {
        this.pending ??= this.order.take(all);
        if (this.pending.length === 0) {
          this.pending = undefined;
          return;
        }
        const { episode_id } = await this.begin();
        await this.settings.session.steps(episode_id, this.batches, this.pending);
        this.pending = undefined;
        this.batches++;
      }
    });
    this.sending = next.catch(() => undefined);
    return next;
  }

  /** End the episode of a settled run (``logs`` when it returned, ``thrown`` when
   * it threw); throws when the episode could not be recorded. */
  async finish(logs: AnyRef[] | undefined, thrown?: unknown): Promise<EndedEpisode> {
    const { episode_id } = await this.begin();
    let error = thrown ?? this.failure;
    let end: EpisodeEndIn;
    try {
      await this.send(true);
      end = await this.verdict(episode_id, logs ?? this.seen, error);
    } catch (failure) {
      error ??= failure;
      end = { outcome: "failure", metadata: { error: summary(failure) } };
      await this.settings.session.end(episode_id, end);
      throw failure;
    }
    await this.settings.session.end(episode_id, end);
    const ended = { episodeId: episode_id, contextId: this.info.contextId, outcome: end.outcome, reward: end.reward ?? null };
    this.settings.onEpisode?.(ended);
    return ended;
  }

  private async verdict(episodeId: string, logs: AnyRef[], error: unknown): Promise<EpisodeEndIn> {
    const run: FinishedRun = {
      ...this.info,
      episodeId,
      logs,
      outputs: logs.filter((log): log is OutputRef => log.ref === "output"),
      ...(error === undefined ? {} : { error }),
    };
    const given = await this.settings.reward?.(run);
    const verdict: Verdict = typeof given === "number" ? { reward: given } : given ?? {};
    const metadata = { ...verdict.metadata, ...(error === undefined ? {} : { error: summary(error) }) };
    return {
      outcome: error === undefined ? verdict.outcome ?? "other" : "failure",
      ...(verdict.reward === undefined ? {} : { reward: verdict.reward }),
      metadata,
    };
  }
}

/** A run's failure to record, as the error ``agent.run`` throws. */
export function notRecorded(error: unknown): StreamExportError {
  return error instanceof StreamExportError
    ? error
    : new StreamExportError(`the run's episode was not recorded: ${summary(error)}`, "not_recorded");
}
