"""``diffusers-tpu generate`` in this process, with a Ctrl-C that CPython drops (tests/commands/test_interrupts.py).

    python interrupt_worker.py compile|loop ARGS...   (ARGS: the command line after ``diffusers-tpu``)

A garbage-collector callback, once armed, sends SIGINT from inside itself: the handler then runs inside the callback and
CPython reports its KeyboardInterrupt as "Exception ignored" instead of raising it — what JAX's own gc callback does to
a real Ctrl-C that lands while it runs. ``compile``: armed when the progress bar opens (the first step's program is
then compiling); ``loop``: after the third step. Prints ``dropped after step N`` when it fired (stderr) and
``step N`` for every step after."""

import gc
import os
import signal
import sys

import tqdm

# Ctrl-C as in a terminal: a shell that started the suite in the background leaves SIGINT ignored in its children
signal.signal(signal.SIGINT, signal.default_int_handler)
moment, argv = sys.argv[1], sys.argv[2:]
STEPS = int(argv[argv.index("--steps") + 1])  # the denoising loop's bar, not the loading bars before it
state = {"armed": False, "fired": False, "steps": 0}


def interrupt_inside_a_gc_callback(phase, info):
    if not state["armed"] or state["fired"]:
        return
    state["fired"] = True
    gc.set_threshold(700)  # CPython's default again
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):  # the handler runs at one of these bytecodes, inside this callback
            pass
    except KeyboardInterrupt:
        print(f"dropped after step {state['steps']}", file=sys.stderr, flush=True)
        raise  # CPython prints "Exception ignored" and carries on
    print("the signal was not delivered inside the callback", file=sys.stderr, flush=True)


gc.callbacks.insert(0, interrupt_inside_a_gc_callback)
stock_init, stock_update = tqdm.tqdm.__init__, tqdm.tqdm.update


def arm():
    # the very next allocation collects: whether a collection happens on its own within the run depends on the machine
    state["armed"] = True
    gc.set_threshold(1)


def init(self, *args, **kwargs):
    stock_init(self, *args, **kwargs)
    if moment == "compile" and self.total == STEPS:
        arm()


def update(self, n=1):
    if self.total != STEPS:
        return stock_update(self, n)
    state["steps"] += n
    if state["fired"]:
        print(f"step {state['steps']}", file=sys.stderr, flush=True)
    if moment == "loop" and state["steps"] == 3:
        arm()
    return stock_update(self, n)


tqdm.tqdm.__init__, tqdm.tqdm.update = init, update

from diffusers_tpu.commands import cli  # noqa: E402

sys.exit(cli.main(argv))
