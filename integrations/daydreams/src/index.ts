/** Record every run of a Daydreams agent with stream-export, in one line:
 *
 * ```ts
 * const agent = createDreams({
 *   model: openai("gpt-4o"),
 *   contexts: [room],
 *   extensions: [streamExport({ gateway: "http://127.0.0.1:9180" })],
 * });
 * ```
 *
 * Each run (`agent.send`, `agent.run`, an input's subscription) becomes one
 * episode of the stream-export gateway: its model calls go through the gateway
 * (token for token where the upstream gives token ids) and its reasoning, action
 * calls, action results and outputs are recorded as the episode's steps, so the
 * records read `{"prompt": <the input>, "completion": <reasoning>\n\nAction:
 * open_door({...})\n\n<result>...}`. See DESIGN.md for the gateway's side. */

import type { AnyAgent, AnyContext, Extension, Handlers } from "@daydreamsai/core";

import { StreamExportError, summary } from "./errors.js";
import { hookProblem, hooksChanged, installedVersion, TESTED_VERSION } from "./hooks.js";
import { notRecorded, RunRecorder, type EndedEpisode, type FinishedRun, type RunInfo, type RunSettings, type Verdict } from "./run.js";
import { Session } from "./session.js";

export { StreamExportError } from "./errors.js";
export { TESTED_VERSION } from "./hooks.js";
export type { EndedEpisode, FinishedRun, RunInfo, Verdict } from "./run.js";
export type { Outcome, StepIn, StepKind } from "./session.js";
export { stepOf, StepOrder } from "./steps.js";

export interface StreamExportOptions {
  /** The gateway's address, e.g. `http://127.0.0.1:9180` (its session API is `/v1/episodes`). */
  gateway: string;
  /** A client key, when the gateway has client keys (`gateway.api_keys_file`). */
  apiKey?: string;
  /** Every episode's `agent_id` (default `daydreams`). */
  agentId?: string;
  /** The model the gateway is asked for (default: the id of the model the run would use). */
  model?: string;
  /** The episode's prompt (default: the run's inputs, each a paragraph; objects as JSON). */
  task?: (run: RunInfo) => string;
  /** The GRPO group of a run's episode (rollouts of one task share its id). */
  group?: (run: RunInfo) => { id: string; size?: number } | undefined;
  /** The episode's metadata (besides `context` and `args`, which it always carries). */
  metadata?: (run: RunInfo) => Record<string, unknown>;
  /** The outcome and reward of a run that did not fail: a number is the reward
   * (outcome `other`); nothing leaves both to a later score. A failed run's
   * outcome is `failure` whatever this says (its reward is still taken). */
  reward?: (run: FinishedRun) => Verdict | number | undefined | Promise<Verdict | number | undefined>;
  /** Called with each ended episode (its id scores it later). */
  onEpisode?: (episode: EndedEpisode) => void;
  /** Each session API request's timeout (default 30 s). */
  timeoutMs?: number;
}

type RunParams = Parameters<AnyAgent["run"]>[0];

/** The extension: put it in `createDreams({ extensions: [...] })`. */
export function streamExport(options: StreamExportOptions): Extension {
  const settings: RunSettings = {
    session: new Session(options.gateway, options.apiKey, options.timeoutMs ?? 30_000),
    agentId: options.agentId ?? "daydreams",
    apiKey: options.apiKey,
    task: options.task ?? inputText,
    group: options.group,
    metadata: options.metadata,
    reward: options.reward,
    onEpisode: options.onEpisode,
  };
  return {
    name: "stream-export",
    inputs: {},
    install(agent: AnyAgent) {
      const version = installedVersion();
      if (version !== TESTED_VERSION) {
        console.warn(
          `stream-export: @daydreamsai/core ${version} is not the tested ${TESTED_VERSION}; ` +
            "every run checks that its hooks still work and fails if they do not",
        );
      }
      install(agent, settings, options.model, version);
    },
  };
}

function install(agent: AnyAgent, settings: RunSettings, model: string | undefined, version: string): void {
  if (typeof agent.run !== "function") throw hooksChanged(version, "the agent has no run()");
  const run = agent.run.bind(agent);
  /** The recorder of the run each context is running (Daydreams runs one run of
   * a context at a time: its queue for the context has concurrency 1). */
  const running = new Map<string, RunRecorder>();
  if (typeof agent.logger?.on === "function") {
    agent.logger.on("*", (entry) => {
      // Daydreams logs with (context, message, data) swapped into (message, context, data).
      if (entry.message === "agent:run" && entry.context === "Step execution failed") {
        const data = entry.data as { contextId?: string; error?: unknown } | undefined;
        if (data?.contextId) running.get(data.contextId)?.stepFailed(data.error);
      }
    });
  }

  agent.run = (async (params: RunParams) => {
    const context = params.context as AnyContext;
    const contextId = agent.getContextId({ context, args: params.args });
    const info: RunInfo = { context: context.type, contextId, args: params.args, inputs: inputsOf(params) };
    const recorder: RunRecorder = new RunRecorder(settings, info, model ?? modelId(agent, params), () =>
      running.set(contextId, recorder),
    );
    const handlers: Partial<Handlers> = recorder.handlers(params.handlers);
    let logs;
    try {
      logs = await run({ ...params, model: recorder.model(), handlers });
    } catch (error) {
      await recorder.finish(undefined, error).catch((failure) => {
        console.warn(`stream-export: the failed run's episode was not recorded: ${summary(failure)}`);
      });
      throw error;
    } finally {
      if (running.get(contextId) === recorder) running.delete(contextId);
    }
    const problem = hookProblem(recorder.sawRun, recorder.calls, logs);
    if (problem) {
      const error = hooksChanged(version, problem);
      await recorder.finish(logs, error).catch(() => undefined);
      throw error;
    }
    try {
      await recorder.finish(logs);
    } catch (failure) {
      throw notRecorded(failure);
    }
    return logs;
  }) as AnyAgent["run"];
}

/** The id of the model a run would use (Daydreams: the run's, the context's, the agent's). */
function modelId(agent: AnyAgent, params: RunParams): string {
  const model = params.model ?? (params.context as AnyContext).model ?? agent.model;
  const id = typeof model === "string" ? model : model?.modelId;
  if (!id) {
    throw new StreamExportError(
      "stream-export: the run has no model to ask the gateway for: give the agent a model, or streamExport({ model })",
      "no_model",
    );
  }
  return id;
}

/** The inputs a run was given (`agent.send` puts its input in the chain). */
function inputsOf(params: RunParams): RunInfo["inputs"] {
  return (params.chain ?? []).filter((log) => log.ref === "input") as RunInfo["inputs"];
}

/** The default task: the run's inputs, each a paragraph (objects as JSON). */
export function inputText(run: RunInfo): string {
  return run.inputs
    .map((input) => (typeof input.content === "string" ? input.content : JSON.stringify(input.content)))
    .join("\n\n");
}
