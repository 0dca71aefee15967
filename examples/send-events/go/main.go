// One episode of step events with franz-go: key = episode_id, value = the event's JSON.
// The broker and topic come from the worker's own variables, with its defaults.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

func env(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok {
		return value
	}
	return fallback
}

func main() {
	client, err := kgo.NewClient( // idempotent, acks=all by default
		kgo.SeedBrokers(strings.Split(env("STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"), ",")...),
		kgo.DefaultProduceTopic(env("STREAM_EXPORT_TOPICS_STEPS", "agent-steps")),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	id := uuid.NewString()
	now := func() float64 { return float64(time.Now().UnixNano()) / 1e9 }
	events := []map[string]any{
		{"type": "start", "v": 1, "episode_id": id, "time": now(), "agent_id": "adventurer-1",
			"prompt": "You are in a dark room with a door to the north."},
		{"type": "step", "v": 1, "episode_id": id, "time": now(), "seq": 0, "kind": "thought",
			"content": "I need to find a way out. I should check if the door is locked."},
		{"type": "step", "v": 1, "episode_id": id, "time": now(), "seq": 1, "kind": "action",
			"content": "try opening the door", "name": "open_door",
			"arguments": map[string]any{"direction": "north"}},
		{"type": "step", "v": 1, "episode_id": id, "time": now(), "seq": 2, "kind": "action_result",
			"content": "The door was unlocked and you were able to exit the room.", "name": "open_door"},
		{"type": "end", "v": 1, "episode_id": id, "time": now(), "steps": 3, "outcome": "success", "reward": 1.0},
	}
	records := make([]*kgo.Record, 0, len(events))
	for _, e := range events {
		value, err := json.Marshal(e)
		if err != nil {
			log.Fatal(err)
		}
		records = append(records, &kgo.Record{Key: []byte(id), Value: value})
	}
	if err := client.ProduceSync(context.Background(), records...).FirstErr(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(id)
}
