// A tool-calling agent on the official `openai` npm package, captured by the
// stream-export gateway with the two-line change the README shows: it starts an
// episode with the session API, then uses the episode id as its API key against
// the gateway's plain /v1 base URL. Run by tests/integration/gateway/test_agents.py:
//
//   node_modules/.bin/tsx agent.ts '{"gateway": "http://...", "model": "tiny", ...}'
//
// It prints one JSON object on stdout: the episode id, every request body it sent
// (so the test can find what vLLM answered to each) and the conversation it held.
import OpenAI from "openai";
import type {
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from "openai/resources/chat/completions";

interface Spec {
  gateway: string;
  model: string;
  tool: ChatCompletionTool;
  messages: ChatCompletionMessageParam[];
  turns: number;
  group_id: string;
  group_size: number;
}

async function session(url: string, body: object): Promise<Record<string, unknown>> {
  const answer = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!answer.ok) throw new Error(`${url} answered ${answer.status}: ${await answer.text()}`);
  return (await answer.json()) as Record<string, unknown>;
}

const spec = JSON.parse(process.argv[2]) as Spec;
const episode = await session(`${spec.gateway}/v1/episodes`, {
  agent_id: "ts-agent",
  prompt: spec.messages,
  group_id: spec.group_id,
  group_size: spec.group_size,
});
const episodeId = String(episode.episode_id);
// The two lines: the gateway's URL, and the episode id as the API key.
const client = new OpenAI({ baseURL: `${spec.gateway}/v1`, apiKey: episodeId, maxRetries: 0 });

const messages: ChatCompletionMessageParam[] = [...spec.messages];
const sent: ChatCompletionCreateParamsNonStreaming[] = [];
const named = { type: "function", function: { name: spec.tool.function.name } } as const;

async function call(seed: number, toolChoice: typeof named | "none", maxTokens: number) {
  const body: ChatCompletionCreateParamsNonStreaming = {
    model: spec.model,
    messages: structuredClone(messages),
    tools: [spec.tool],
    tool_choice: toolChoice,
    max_tokens: maxTokens,
    seed,
  };
  sent.push(body);
  const answer = await client.chat.completions.create(body);
  const { role, content, tool_calls } = answer.choices[0].message;
  const message = { role, content, ...(tool_calls ? { tool_calls } : {}) };
  messages.push(message);
  return message;
}

for (let turn = 0; turn < spec.turns; turn++) {
  const message = await call(turn + 1, named, 60);
  for (const toolCall of message.tool_calls ?? []) {
    if (toolCall.type !== "function") continue;
    const { city } = JSON.parse(toolCall.function.arguments) as { city: string };
    messages.push({ role: "tool", tool_call_id: toolCall.id, content: `${city}: rain` });
  }
}
await call(99, "none", 8);
const ended = await session(`${spec.gateway}/v1/episodes/${episodeId}/end`, {
  outcome: "success",
  reward: 0.5,
});
process.stdout.write(JSON.stringify({ episode_id: episodeId, sent, messages, ended }) + "\n");
