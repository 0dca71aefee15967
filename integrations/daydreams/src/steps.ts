/** Daydreams' parsed log entries as the contract's steps (pure, no I/O).
 *
 * | Daydreams log (done)      | step                                                    |
 * | ------------------------- | ------------------------------------------------------- |
 * | `thought`                 | `thought`: its text                                     |
 * | `action_call`             | `action`: name, arguments (its parsed JSON object), id  |
 * | `action_result`           | `action_result`: name, the result (text, else data), id of its call |
 * | `output`                  | `output`: name, its text (else data)                    |
 * | `event` about an action   | `action_result` of that call: `{"error": ...}` (a call Daydreams could not run) |
 * | other `event`             | `observation`: name, data                               |
 * | `input`, `run`, `step`    | none: the inputs are the episode's prompt               |
 *
 * Texts are trimmed (the model's whitespace around a tag's content is not part of
 * it). An action whose arguments are not a JSON object (a string, a list, content
 * Daydreams could not parse) keeps its raw text as content instead. Daydreams
 * reports an action's result before the call itself (the call's log is finished
 * only once its result is in); ``StepOrder`` puts every result after its call. */

import type { AnyRef } from "@daydreamsai/core";

import type { StepIn } from "./session.js";

type Json = Record<string, unknown>;

/** The contract step for a finished Daydreams log entry, if it is one. */
export function stepOf(log: AnyRef): StepIn | undefined {
  switch (log.ref) {
    case "thought":
      return { kind: "thought", content: log.content.trim() };
    case "action_call":
      return isObject(log.data)
        ? { kind: "action", content: "", name: log.name, arguments: plain(log.data), id: log.id }
        : { kind: "action", content: (log.content ?? "").trim(), name: log.name, id: log.id };
    case "action_result":
      return { kind: "action_result", name: log.name, id: log.callId, ...payload(log.data) };
    case "output":
      return { kind: "output", name: log.name, ...payload(log.data ?? log.content) };
    case "event": {
      const ref = (log.data as { ref?: { ref?: string; id?: string; name?: string } } | undefined)?.ref;
      if (log.name === "error" && ref?.ref === "action_call") {
        const error = (log.data as { error?: unknown }).error;
        return { kind: "action_result", content: "", name: ref.name, id: ref.id, data: plain({ error }) };
      }
      return { kind: "observation", content: "", name: log.name, data: plain(log.data ?? null) };
    }
    default:
      return undefined;
  }
}

/** A text as content, anything else as JSON data. */
function payload(value: unknown): { content: string; data?: unknown } {
  if (typeof value === "string") return { content: value.trim() };
  return { content: "", data: plain(value ?? null) };
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** ``value`` as plain JSON (what the gateway can record): functions and undefined
 * dropped as JSON.stringify drops them; a value JSON cannot hold becomes its text. */
function plain<T>(value: T): T {
  try {
    const text = JSON.stringify(value);
    return (text === undefined ? null : JSON.parse(text)) as T;
  } catch {
    return String(value) as T;
  }
}

/** The steps of one run in the order they happened, each action result after its
 * action: a result whose call has not been reported yet waits for it. */
export class StepOrder {
  private ready: StepIn[] = [];
  /** Results waiting for their call, by the call's id. */
  private waiting = new Map<string, StepIn[]>();
  /** Ids of the actions reported so far. */
  private actions = new Set<string>();

  add(step: StepIn): void {
    if (step.kind === "action_result" && step.id && !this.actions.has(step.id)) {
      this.waiting.set(step.id, [...(this.waiting.get(step.id) ?? []), step]);
      return;
    }
    this.ready.push(step);
    if (step.kind === "action" && step.id) {
      this.actions.add(step.id);
      this.ready.push(...(this.waiting.get(step.id) ?? []));
      this.waiting.delete(step.id);
    }
  }

  /** The steps ready to send (taken out); with ``all``, also results whose call
   * never came (a call Daydreams dropped), so nothing is lost. */
  take(all = false): StepIn[] {
    const out = this.ready;
    this.ready = [];
    if (all) {
      for (const steps of this.waiting.values()) out.push(...steps);
      this.waiting.clear();
    }
    return out;
  }
}
