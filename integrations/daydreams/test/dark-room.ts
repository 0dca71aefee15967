/** A Daydreams dark-room agent recorded by stream-export: the agent is plain
 * Daydreams, and `extensions: [streamExport(...)]` is the one line that records it.
 *
 *   node build-test/test/dark-room.js --gateway http://127.0.0.1:9180 --episodes 3
 *
 * Each episode is one `agent.send` of the room's description to a fresh context
 * (its own rollout key, so no run sees another's memory); the rollouts of one
 * run of this script share a GRPO group. It prints one JSON line per episode
 * (`episode_id`, `outcome`, `reward`, or `error` for a run that threw).
 *
 * Options: --model ID (default `dark-room`, the scripted upstream's), --base-url URL
 * (where the agent's own model is served; the extension sends each run's calls to
 * the gateway instead), --group ID,
 * --concurrency N (runs at once), --max-tokens N, --compact-prompt (a short
 * prompt builder, for a model with a small context), --throw step|run (the
 * context's onStep / onRun throws: Daydreams swallows the first and rethrows the
 * second). */

import { createOpenAI } from "@ai-sdk/openai";
import { action, context, createDreams, input, LogLevel, output, type PromptBuilder } from "@daydreamsai/core";
import { parseArgs } from "node:util";
import * as z from "zod";

import { streamExport, type EndedEpisode } from "../src/index.js";

const { values: opts } = parseArgs({
  options: {
    gateway: { type: "string" },
    episodes: { type: "string", default: "1" },
    concurrency: { type: "string", default: "1" },
    model: { type: "string", default: "dark-room" },
    "base-url": { type: "string" },
    group: { type: "string", default: "dark-room-north" },
    "max-tokens": { type: "string", default: "256" },
    "compact-prompt": { type: "boolean", default: false },
    throw: { type: "string" },
  },
});
if (!opts.gateway) throw new Error("--gateway URL is required");

const TASK = "You are in a dark room with a door to the north.";
/** What the door answers (the seed record's result). */
const RESULT = "I found the door was unlocked and was able to exit the room.";

const room = context({
  type: "dark-room",
  schema: {
    rollout: z.string(),
    room: z.object({ name: z.string(), exits: z.array(z.string()) }),
  },
  key: ({ rollout }) => rollout,
  maxSteps: 4,
  inputs: { text: input({ schema: z.string() }) },
  // No output handler: Daydreams 0.3.22 calls Promise.try for one, which Node 20 lacks.
  outputs: { text: output({ description: "Say what happened.", schema: z.string() }) },
  onStep: async () => {
    if (opts.throw === "step") throw new Error("the agent failed in a step");
  },
  onRun: async () => {
    if (opts.throw === "run") throw new Error("the agent failed after its run");
  },
}).setActions([
  action({
    name: "open_door",
    description: "Open the door on one side of the room.",
    schema: { direction: z.string().describe("north, south, east or west") },
    handler: async ({ direction }) => (direction === "north" ? RESULT : `There is no door to the ${direction}.`),
  }),
]);

/** A prompt that fits a 512-token model: the task, the last result, the format. */
const compact: PromptBuilder = {
  name: "compact",
  build: ({ workingMemory }) => ({
    prompt:
      `${TASK}\nResults: ${workingMemory.results.map((r) => JSON.stringify(r.data)).join("; ") || "none"}\n` +
      'Answer <reasoning>...</reasoning> then <action_call name="open_door">{"direction":"north"}</action_call>.',
  }),
};

const ended = new Map<string, EndedEpisode>();
const agent = createDreams({
  model: createOpenAI({ apiKey: "unused", baseURL: opts["base-url"] }).chat(opts.model!),
  // ai 5 reads maxOutputTokens (Daydreams' own maxTokens is dropped).
  modelSettings: { maxOutputTokens: Number(opts["max-tokens"]) },
  contexts: [room],
  logLevel: LogLevel.ERROR,
  ...(opts["compact-prompt"] ? { prompt: compact } : {}),
  extensions: [
    streamExport({
      gateway: opts.gateway,
      agentId: "daydreams-agent",
      group: () => ({ id: opts.group!, size: Number(opts.episodes) }),
      metadata: () => ({ domain: "text-adventure", difficulty: "easy" }),
      reward: ({ logs }) => {
        const out = logs.some((l) => l.ref === "action_result" && l.name === "open_door" && l.data === RESULT);
        return { outcome: out ? "success" : "failure", reward: out ? 1 : 0 };
      },
      onEpisode: (episode) => ended.set(episode.contextId, episode),
    }),
  ],
});
await agent.start();

async function rollout(index: number): Promise<void> {
  try {
    await agent.send({
      context: room,
      args: { rollout: `r${index}`, room: { name: "dark room", exits: ["north"] } },
      input: { type: "text", data: TASK },
    });
    const episode = ended.get(`dark-room:r${index}`);
    console.log(JSON.stringify({ rollout: index, episode_id: episode?.episodeId, outcome: episode?.outcome, reward: episode?.reward }));
  } catch (error) {
    console.log(JSON.stringify({ rollout: index, error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) }));
  }
}

const total = Number(opts.episodes);
let next = 0;
await Promise.all(
  Array.from({ length: Math.min(Number(opts.concurrency), total) }, async () => {
    while (next < total) await rollout(next++);
  }),
);
await agent.stop();
