"""One episode of step events with the episode recorder. The broker and topic come from
the worker's own settings (STREAM_EXPORT_* variables, or the defaults)."""

import asyncio

from stream_export import settings
from stream_export.client import Producer


async def main() -> None:
    async with (
        Producer.from_settings(settings.load()) as producer,  # or Producer("host:9092")
        producer.episode(
            agent_id="adventurer-1", prompt="You are in a dark room with a door to the north."
        ) as ep,
    ):
        await ep.thought("I need to find a way out. I should check if the door is locked.")
        await ep.action("try opening the door", name="open_door", arguments={"direction": "north"})
        await ep.result(
            "The door was unlocked and you were able to exit the room.", name="open_door"
        )
        await ep.end("success", reward=1.0)
    print(ep.episode_id)


asyncio.run(main())
