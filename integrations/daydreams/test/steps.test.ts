/** Daydreams log entries -> contract steps, on entries as @daydreamsai/core 0.3.22
 * reports them to `handlers.onLogStream` (copied from a dark-room run). */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { AnyRef } from "@daydreamsai/core";

import { hookProblem } from "../src/hooks.js";
import { inputText } from "../src/index.js";
import { StepOrder, stepOf } from "../src/steps.js";

const CALL_ID = "01a24fa4-6e4f-75ad-8aac-00a06d6f4403";
const thought = {
  id: "01a24fa4-6e31-74fc-8e28-f8f1bd95ae31",
  timestamp: 1796632505905,
  processed: false,
  ref: "thought",
  content: "I need to find a way out. I should check if the door is locked.",
} as AnyRef;
const result = {
  ref: "action_result",
  id: "01a24fa4-6eaf-7509-acc0-d40a9002c2d6",
  callId: CALL_ID,
  data: "I found the door was unlocked and was able to exit the room.",
  name: "open_door",
  timestamp: 1796632506031,
  processed: false,
} as AnyRef;
const call = {
  id: CALL_ID,
  timestamp: 1796632505935,
  processed: true,
  ref: "action_call",
  name: "open_door",
  params: {},
  content: '{"direction": "north"}',
  data: { direction: "north" },
} as AnyRef;
const output = {
  id: "01a24fa4-93f8-7078-9fd7-41017e412d0b",
  timestamp: 1796632515576,
  processed: true,
  ref: "output",
  name: "text",
  params: {},
  content: "I am out of the dark room.",
  data: "I am out of the dark room.",
} as AnyRef;

test("each kind of entry becomes its step", () => {
  assert.deepEqual(stepOf(thought), {
    kind: "thought",
    content: "I need to find a way out. I should check if the door is locked.",
  });
  assert.deepEqual(stepOf(call), {
    kind: "action",
    content: "",
    name: "open_door",
    arguments: { direction: "north" },
    id: CALL_ID,
  });
  assert.deepEqual(stepOf(result), {
    kind: "action_result",
    name: "open_door",
    id: CALL_ID,
    content: "I found the door was unlocked and was able to exit the room.",
  });
  assert.deepEqual(stepOf(output), { kind: "output", name: "text", content: "I am out of the dark room." });
  for (const ref of ["run", "step", "input"]) assert.equal(stepOf({ ...thought, ref } as AnyRef), undefined);
});

test("structured results and outputs are data; texts are trimmed", () => {
  assert.deepEqual(stepOf({ ...result, data: { opened: true, turns: 3 } } as AnyRef), {
    kind: "action_result",
    name: "open_door",
    id: CALL_ID,
    content: "",
    data: { opened: true, turns: 3 },
  });
  assert.equal(stepOf({ ...thought, content: "\n  spaced  \n" } as AnyRef)?.content, "spaced");
  // An action result that failed: Daydreams makes its data {error: {...}}.
  const failed = stepOf({ ...result, data: { error: { name: "Error", message: "stuck" } } } as AnyRef);
  assert.deepEqual(failed?.data, { error: { name: "Error", message: "stuck" } });
});

test("an action whose arguments are not an object keeps its text", () => {
  const unparsed = { ...call, data: undefined, content: " try opening the door " } as AnyRef;
  assert.deepEqual(stepOf(unparsed), { kind: "action", content: "try opening the door", name: "open_door", id: CALL_ID });
});

test("Daydreams' error about an action call is that call's result", () => {
  const error = {
    ref: "event",
    id: "e1",
    name: "error",
    data: {
      ref: { ref: "action_call", id: CALL_ID, name: "open_window" },
      error: { name: "NotFoundError", message: "Invalid action name" },
    },
    processed: false,
    timestamp: 1,
  } as AnyRef;
  assert.deepEqual(stepOf(error), {
    kind: "action_result",
    content: "",
    name: "open_window",
    id: CALL_ID,
    data: { error: { name: "NotFoundError", message: "Invalid action name" } },
  });
  const other = { ...error, name: "door_creaks", data: { loud: true } } as AnyRef;
  assert.deepEqual(stepOf(other), { kind: "observation", content: "", name: "door_creaks", data: { loud: true } });
});

test("data JSON cannot hold becomes text, and undefined parts are dropped", () => {
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  assert.equal(stepOf({ ...result, data: cyclic } as AnyRef)?.data, "[object Object]");
  assert.deepEqual(stepOf({ ...result, data: { a: 1, b: undefined } } as AnyRef)?.data, { a: 1 });
});

test("a result reported before its call follows it; nothing is lost at the end", () => {
  const order = new StepOrder();
  for (const log of [thought, result, call, output]) order.add(stepOf(log)!);
  assert.deepEqual(
    order.take().map((s) => s.kind),
    ["thought", "action", "action_result", "output"],
  );
  assert.deepEqual(order.take(), []);
  order.add(stepOf({ ...result, callId: "never-reported" } as AnyRef)!);
  assert.deepEqual(order.take(), []);
  assert.deepEqual(order.take(true).map((s) => s.id), ["never-reported"]);
});

test("the task is the run's inputs, one paragraph each", () => {
  const input = (content: unknown) => ({ ref: "input" as const, id: "i", type: "text", content, data: undefined, timestamp: 0, processed: false });
  const run = { context: "dark-room", contextId: "dark-room:r0", args: {}, inputs: [input("Room one."), input({ door: "north" })] };
  assert.equal(inputText(run), 'Room one.\n\n{"door":"north"}');
});

test("a run whose entries or model calls bypassed the extension is a hook problem", () => {
  const step = (prompt?: string) => ({ ref: "step", data: prompt === undefined ? {} : { prompt } });
  assert.equal(hookProblem(true, 2, [step("a"), step("b")]), undefined);
  // A step that failed before its prompt was built made no call.
  assert.equal(hookProblem(true, 0, [step()]), undefined);
  assert.match(hookProblem(true, 1, [step("a"), step("b")])!, /no longer calls the run's own model/);
  assert.match(hookProblem(false, 0, [step()])!, /no longer passes log entries/);
});
