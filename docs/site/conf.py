"""Sphinx configuration of the lessons' site (``make site``: tools/build_site.py stages the pages, then runs
``python -m sphinx -c docs/site``).

Sphinx, with myst-nb to read the notebooks and sphinx-book-theme to lay them out, pinned in pyproject's ``site``
extra. Why these: they are the field's tools for books of notebooks (Jupyter Book 1 is this same stack), they
render every output a notebook saved (HTML tables, PNG figures, text) as it was saved, and the whole build runs
offline. Jupyter Book 2 (mystmd) does not: it fetches its site template from the internet at build time and
fails without it ("Querying template metadata ... ENOTFOUND").

Nothing here runs a notebook (``nb_execution_mode = "off"``): the pages show the outputs of the run that
``make notebooks`` and tests/test_browser.py saved in out/executed/.
"""

project = "kit: TensorFlow distributed training, one notebook at a time"
author = "the kit's authors"
copyright = "the kit's authors, Apache License 2.0"

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# the notebooks' outputs as saved; never execute
nb_execution_mode = "off"
# stdout lines of one cell in one block, as JupyterLab shows them
nb_merge_streams = True
# a check cell (tag "check", input collapsed in JupyterLab) gets the tag hide-input from tools/build_site.py
# and a prompt of its own (cell metadata "mystnb"); this is what the other collapsed cells say
nb_code_prompt_show = "Show the code"
nb_code_prompt_hide = "Hide the code"
# no widget manager from a CDN: the executed notebooks keep no widget state (nbval runs with the text view,
# and tools/build_site.py replaces a JupyterLab widget by the HTML the page showed)
nb_ipywidgets_js = {}
# $k\eta$ in notebook 08's text
myst_enable_extensions = ["dollarmath", "colon_fence"]
# links from the notebooks to files that are not pages (../README.md, results/*.csv) stay plain links
suppress_warnings = ["myst.xref_missing", "myst.header"]

html_theme = "sphinx_book_theme"
html_title = "kit: distributed TensorFlow, one notebook at a time"
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,   # the page's .ipynb, with its outputs
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
}
# _sources/ keeps each executed notebook, for the download button; no "show source" link besides
html_copy_source = True
html_show_sourcelink = False
html_last_updated_fmt = "%Y-%m-%d %H:%M UTC"
html_static_path = ["_static"]
html_css_files = ["site.css"]
