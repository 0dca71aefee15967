// One episode of step events with kafkajs: key = episode_id, value = the event's JSON.
// The broker and topic come from the worker's own variables, with its defaults.
import { randomUUID } from "node:crypto";
import { Kafka, Partitioners } from "kafkajs";

const brokers = (process.env.STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS ?? "127.0.0.1:9092").split(",");
const topic = process.env.STREAM_EXPORT_TOPICS_STEPS ?? "agent-steps";

const producer = new Kafka({ clientId: "adventurer", brokers }).producer({
  createPartitioner: Partitioners.DefaultPartitioner, // the Java client's, as the worker's
  idempotent: true,
  maxInFlightRequests: 1,
});
await producer.connect();
const id = randomUUID();
const now = () => Date.now() / 1000;
const events = [
  { type: "start", v: 1, episode_id: id, time: now(), agent_id: "adventurer-1",
    prompt: "You are in a dark room with a door to the north." },
  { type: "step", v: 1, episode_id: id, time: now(), seq: 0, kind: "thought",
    content: "I need to find a way out. I should check if the door is locked." },
  { type: "step", v: 1, episode_id: id, time: now(), seq: 1, kind: "action",
    content: "try opening the door", name: "open_door", arguments: { direction: "north" } },
  { type: "step", v: 1, episode_id: id, time: now(), seq: 2, kind: "action_result",
    content: "The door was unlocked and you were able to exit the room.", name: "open_door" },
  { type: "end", v: 1, episode_id: id, time: now(), steps: 3, outcome: "success", reward: 1.0 },
];
try {
  await producer.send({
    topic,
    acks: -1,
    messages: events.map((e) => ({ key: id, value: JSON.stringify(e) })),
  });
} finally {
  await producer.disconnect();
}
console.log(id);
