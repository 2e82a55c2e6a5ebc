"""The Python SDK over TLS, run by tests/replog_tls.rs through
scripts/python_sdk.sh.

    tls_flow.py TLS_CONNECTION_STRING PLAIN_CONNECTION_STRING

Over TLS: connect (the connection string logs in), create stream "python"
with the one-partition topic "tls", send three messages and poll them
back. Without TLS: the same server must refuse the connection. Prints
"python over tls: ok" when all held; every wait is bounded.
"""

import asyncio
import os
import sys

from apache_iggy import Consumer, IggyClient, PollingStrategy, SendMessage

TIMEOUT_S = 20


async def over_tls(connection_string: str) -> None:
    client = IggyClient.from_connection_string(connection_string)
    await client.connect()
    await client.login_user("iggy", "iggy")
    await client.ping()
    await client.create_stream("python")
    await client.create_topic("python", "tls", partitions_count=1)
    texts = [f"py-{i}" for i in range(3)]
    await client.send_messages("python", "tls", 0, [SendMessage(t) for t in texts])
    polled = await client.poll_messages(
        "python",
        "tls",
        consumer=Consumer.Single(1),
        polling_strategy=PollingStrategy.Offset(0),
        count=10,
        auto_commit=False,
        partition_id=0,
    )
    got = [m.payload().decode() for m in polled]
    assert got == texts, f"polled {got}, sent {texts}"


async def plain_refused(connection_string: str) -> None:
    client = IggyClient.from_connection_string(connection_string)
    try:
        await client.connect()
        await client.login_user("iggy", "iggy")
        await client.get_streams()
    except Exception as error:  # the SDK raises RuntimeError subclasses
        print(f"a plain client was refused: {error}")
        return
    raise AssertionError("a plain client was served by a TLS listener")


async def main() -> None:
    tls, plain = sys.argv[1], sys.argv[2]
    await asyncio.wait_for(over_tls(tls), TIMEOUT_S)
    await asyncio.wait_for(plain_refused(plain), TIMEOUT_S)
    print("python over tls: ok")


if __name__ == "__main__":
    asyncio.run(main())
    # apache-iggy 0.9.0 aborts (SIGABRT) while the interpreter finalizes
    # once any IggyClient was made, even one that never connected: its
    # runtime's teardown, not this program's checks, which all ran above.
    # Exit without finalizing so the status tells only about them.
    sys.stdout.flush()
    os._exit(0)
