"""The lesson's code lives in notebook cells: a learner edits a cell, reruns, and every task runs the edit.

`cluster.run(fn)` ships a function defined in the notebook by value (cloudpickle), with the notebook
functions and globals it uses; nothing of the notebook is imported on the engines. This test drives a
real Jupyter kernel the way a learner does: it runs the cells, edits the body of a helper that the run
function calls (and a global in another cell), reruns those cells, runs the same run cell again, and
checks the new behaviour on each task.
"""

from __future__ import annotations

import textwrap

import nbformat
import pytest

SETUP = """
import kit
cluster = kit.TFCluster(workers=2, view="text").start()
"""
UNITS = "UNITS = 10"
HELPER = '''
def build_model():
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(UNITS)])
'''
EDITED_HELPER = '''
def build_model():
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(UNITS),
                                tf.keras.layers.Dense(3, name="added_in_the_edit")])
'''
RUN = """
def describe():
    import inspect, os
    model = build_model()
    source_here = inspect.getsource(build_model)  # the cell's source, as the engine sees it
    return os.environ["KIT_TASK"], [(layer.name, layer.units) for layer in model.layers], source_here

answers = cluster.run(describe)
print("ANSWERS", answers)
"""
STOP = "cluster.stop()"


def _printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def _answers(cell) -> list:
    import ast

    line = next(line for line in _printed(cell).splitlines() if line.startswith("ANSWERS "))
    return ast.literal_eval(line[len("ANSWERS "):])


@pytest.mark.slow
def test_an_edited_cell_takes_effect_on_every_task_at_the_next_run(tmp_path, no_leaks):
    from nbclient import NotebookClient

    cells = [nbformat.v4.new_code_cell(textwrap.dedent(source)) for source in (SETUP, UNITS, HELPER, RUN, STOP)]
    nb = nbformat.v4.new_notebook(cells=cells)
    client = NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        try:
            for index in range(4):
                client.execute_cell(nb.cells[index], index)
            before = _answers(nb.cells[3])
            # the learner edits two cells (a global and the helper's body) and reruns them, then the run cell
            nb.cells[1].source = "UNITS = 7"
            nb.cells[2].source = textwrap.dedent(EDITED_HELPER)
            for index in (1, 2, 3):
                client.execute_cell(nb.cells[index], index)
            after = _answers(nb.cells[3])
        finally:
            client.execute_cell(nb.cells[4], 4)
    assert [task for task, *_ in before] == [task for task, *_ in after] == ["worker:0", "worker:1"]
    for task, layers, source in before:
        assert [units for _, units in layers] == [10], (task, layers)
        assert source.strip() == HELPER.strip(), source  # inspect (and AutoGraph) find the cell's source
    for task, layers, source in after:  # the same engines run the edited helper, with the edited global
        assert [units for _, units in layers] == [7, 3] and layers[-1][0] == "added_in_the_edit", (task, layers)
        assert source.strip() == EDITED_HELPER.strip(), source
    assert "Traceback" not in _printed(nb.cells[3])


@pytest.mark.slow
def test_autograph_converts_functions_defined_in_cells_without_warnings(tmp_path, no_leaks):
    """A ``map`` function from a cell has its source on the engines: AutoGraph converts it quietly."""
    from nbclient import NotebookClient

    run = textwrap.dedent('''
        def scaled_sum():
            import tensorflow as tf
            def scale(x):
                if x > 2:  # a Python `if` on a tensor: only AutoGraph makes this work in a dataset
                    return x * 10
                return x
            return sum(int(v) for v in tf.data.Dataset.range(5).map(scale))

        answers = cluster.run(scaled_sum)
        output = "\\n".join(cluster.output.values())
        print("ANSWERS", answers)
        print("AUTOGRAPH_WARNED", "could not" in output.lower() and "autograph" in output.lower())
        ''')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(SETUP)),
                                         nbformat.v4.new_code_cell(run), nbformat.v4.new_code_cell(STOP)])
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        try:
            client.execute_cell(nb.cells[0], 0)
            client.execute_cell(nb.cells[1], 1)
        finally:
            client.execute_cell(nb.cells[2], 2)
    assert _answers(nb.cells[1]) == [0 + 1 + 2 + 30 + 40] * 2
    assert "AUTOGRAPH_WARNED False" in _printed(nb.cells[1]), _printed(nb.cells[1])
