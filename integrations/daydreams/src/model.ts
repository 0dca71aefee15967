/** The model one run calls: OpenAI chat completions at its episode's base URL.
 *
 * Its own object per run, so a call can never be told apart by async context
 * (Daydreams' task queue runs one run's model call in another run's context).
 * Before each call it waits for the episode (started when the run starts) and
 * sends the steps the run reported since the previous call, so the gateway
 * records them between the two calls. It reports how each call ended: Daydreams
 * catches a model's errors itself and ends the run as if nothing happened. */

import { createOpenAI } from "@ai-sdk/openai";

import type { Started } from "./session.js";

type ChatModel = ReturnType<ReturnType<typeof createOpenAI>["chat"]>;
type CallOptions = Parameters<ChatModel["doStream"]>[0];
type StreamPart = Awaited<ReturnType<ChatModel["doStream"]>>["stream"] extends ReadableStream<
  infer P
>
  ? P
  : never;

export interface CallHooks {
  /** The episode (and the steps so far sent) before a call goes out. */
  before(): Promise<Started>;
  /** A call ended: ``error`` when it failed (refused, or its stream broke). */
  after(error?: unknown): void;
}

/** The API key calls send: the client key, else the episode id (what a gateway
 * without client keys binds a call by; the base URL binds it already). */
export function runModel(
  modelId: string,
  apiKey: string | undefined,
  hooks: CallHooks,
): ChatModel {
  const inner = async (): Promise<ChatModel> => {
    const episode = await hooks.before();
    const provider = createOpenAI({
      baseURL: episode.base_url,
      apiKey: apiKey ?? episode.episode_id,
      name: "stream-export",
    });
    return provider.chat(modelId);
  };
  return {
    specificationVersion: "v2",
    provider: "stream-export",
    modelId,
    supportedUrls: {},
    async doGenerate(options: CallOptions) {
      const model = await inner();
      try {
        const answer = await model.doGenerate(options);
        hooks.after();
        return answer;
      } catch (error) {
        hooks.after(error);
        throw error;
      }
    },
    async doStream(options: CallOptions) {
      let answer;
      try {
        answer = await (await inner()).doStream(options);
      } catch (error) {
        hooks.after(error);
        throw error;
      }
      return { ...answer, stream: observed(answer.stream, hooks) };
    },
  } as ChatModel;
}

/** ``stream`` as it is, telling ``hooks`` once how it ended: an error part, a
 * broken stream, or a finish without a reason from the server all fail the call. */
function observed(stream: ReadableStream<StreamPart>, hooks: CallHooks): ReadableStream<StreamPart> {
  const reader = stream.getReader();
  let error: unknown;
  let finished = false;
  let told = false;
  const tell = (failure?: unknown): void => {
    if (!told) hooks.after(failure);
    told = true;
  };
  return new ReadableStream<StreamPart>({
    async pull(controller) {
      let next: ReadableStreamReadResult<StreamPart>;
      try {
        next = await reader.read();
      } catch (failure) {
        tell(failure);
        controller.error(failure);
        return;
      }
      if (next.done) {
        tell(error ?? (finished ? undefined : new Error("the model's answer ended without a finish reason")));
        controller.close();
        return;
      }
      const part = next.value;
      if (part.type === "error") error ??= part.error;
      if (part.type === "finish") finished = part.finishReason !== "unknown" && part.finishReason !== "error";
      controller.enqueue(part);
    },
    async cancel(reason) {
      tell(reason ?? new Error("the model's answer was cancelled"));
      await reader.cancel(reason);
    },
  });
}
