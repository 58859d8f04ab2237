#!/usr/bin/env python3
"""Reads the TensorBoard event files in a log directory with TensorBoard's own loader and prints them
as one JSON object, for engine/tests/tensorboard.rs to compare with the run's --metrics rows.

Usage: read_events.py LOGDIR

Output: {"events": [...], "plugin_tags": {...}}. Each event is {"file", "wall_time", "step"} plus, by
kind, "file_version", "session_log" (the status's name), or "scalars" {tag: value} and "texts"
{tag: text}. The events come from EventFileLoader, which applies TensorBoard's data_compat migration
(a simple_value becomes a scalars-plugin tensor), so what is printed is what the dashboards ingest.
"plugin_tags" is what the plugin event accumulator files under the scalars and text plugins for the
whole directory.
"""

import json
import os
import sys

from tensorboard.backend.event_processing import event_file_loader, plugin_event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util


def summary_values(event):
    """The event's scalars and texts, by tag, as the scalars and text plugins would read them."""
    scalars, texts, other = {}, {}, []
    for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        array = tensor_util.make_ndarray(value.tensor)
        if plugin == "scalars" and array.shape == ():
            scalars[value.tag] = float(array.item())
        elif plugin == "text" and array.shape == ():
            texts[value.tag] = array.item().decode("utf-8")
        else:
            other.append(value.tag)
    return scalars, texts, other


def read_file(logdir, name):
    rows = []
    for event in event_file_loader.EventFileLoader(os.path.join(logdir, name)).Load():
        row = {"file": name, "wall_time": event.wall_time, "step": event.step}
        kind = event.WhichOneof("what")
        if kind == "file_version":
            row["file_version"] = event.file_version
        elif kind == "session_log":
            row["session_log"] = event_pb2.SessionLog.SessionStatus.Name(event.session_log.status)
        elif kind == "summary":
            row["scalars"], row["texts"], row["other"] = summary_values(event)
        else:
            row["unexpected"] = kind
        rows.append(row)
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    logdir = sys.argv[1]
    files = [read_file(logdir, n) for n in sorted(os.listdir(logdir)) if "tfevents" in n]
    # In the order they were written: by their first event's time (names hold whole seconds only).
    files.sort(key=lambda rows: rows[0]["wall_time"] if rows else 0.0)
    events = [row for rows in files for row in rows]
    accumulator = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
    accumulator.Reload()
    plugin_tags = {}
    for plugin in ("scalars", "text"):
        try:
            plugin_tags[plugin] = sorted(accumulator.PluginTagToContent(plugin))
        except KeyError:  # no tag of that plugin at all
            plugin_tags[plugin] = []
    print(json.dumps({"events": events, "plugin_tags": plugin_tags}))


if __name__ == "__main__":
    main()
