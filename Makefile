# Two commands set everything up: `make demo` and `make test` (each creates .venv on first use).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOROVOD_STAMP := $(VENV)/.installed-horovod
# The tested set for the Python that makes .venv: locks/py3.11.txt, py3.12.txt or py3.13.txt (make lock writes them)
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
LOCK := locks/py$(PYVER).txt
PYTHONS := 3.11 3.12 3.13

.PHONY: demo test check exercises unit quick notebooks binder lab bench faults compat horovod lock badges clean chromium netns-tools cluster-tools learner-tools site site-check

LAB_STAMP := $(VENV)/.installed-lab
SITE_STAMP := $(VENV)/.installed-site

# Python with pip and venv is all it needs: no compiler, no root (Horovod is built by `make horovod`, only for what uses it)
$(STAMP): pyproject.toml $(wildcard $(LOCK))
	@test -f "$(LOCK)" || { echo "no tested set for Python '$(PYVER)' ($(PYTHON)): the kit is tested on $(PYTHONS) (locks/)." \
	  "Fix: make PYTHON=python3.13 (or 3.11, 3.12)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip 'setuptools>=77,<85'  # pyproject's build-system: pip wheel --no-build-isolation works here
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev]'
	touch $(STAMP)

# Horovod 0.28.1 from PyPI's sdist + patches/ (TensorFlow 2.21), built once into ~/.cache/kit/wheels (needs cmake
# and g++; about 2-5 minutes on 2 cores), then reused: for notebooks 09 and 09b, the bench and the tests
$(HOROVOD_STAMP): $(STAMP) kit/tools/horovod_wheel.sh patches/horovod-0.28.1-tf2.21.patch
	bash kit/tools/horovod_wheel.sh $(BIN)/python
	touch $(HOROVOD_STAMP)
horovod: $(HOROVOD_STAMP)  ## build and install Horovod (cmake and g++) for notebooks 09 and 09b

# locks/py3.X.txt from pyproject.toml's ranges and extras, for Linux x86_64 (uv pip compile: a Python's lock needs no
# interpreter of that version), keeping the versions a lock has unless UPGRADE=1; then environment.yml and
# binder/environment.yml from the lock of 3.11 (tools/environment_yml.py)
lock: $(STAMP)  ## rewrite locks/ (UPGRADE=1: the newest releases the ranges allow) and the conda environments
	$(BIN)/python -m pip install --quiet 'uv==0.13.9'
	for v in $(PYTHONS); do $(BIN)/uv pip compile pyproject.toml --all-extras --python-version $$v \
	  --python-platform x86_64-manylinux_2_28 --no-header --quiet $(if $(UPGRADE),--upgrade) -o locks/py$$v.txt || exit 1; done
	$(BIN)/python tools/environment_yml.py

# the "Open in Colab" badges, the first cell that installs the kit and the links to the repository's files, in every
# notebook and the README, from [project.urls] Repository (tools/colab.py)
badges:
	$(PYTHON) tools/colab.py

$(LAB_STAMP): $(STAMP)  # the lab extra for `make lab` (the dev extra has JupyterLab too, for tests/test_browser.py)
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev,lab]'
	touch $(LAB_STAMP)

$(SITE_STAMP): $(STAMP)  # the site extra for `make site`: Sphinx, myst-nb, sphinx-book-theme
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev,site]'
	touch $(SITE_STAMP)

# $(call apt_install,CHECK,PACKAGES,WHAT FOR): as root, where CHECK (a shell test) fails, install PACKAGES with
# tools/apt_install.sh: no service started or enabled at boot (the tests run the daemons themselves, in namespaces),
# `apt-get update` only if the lists are stale; otherwise nothing (the tests that need them skip and name the command)
apt_install = @if ! { $(1); } && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  sh tools/apt_install.sh "$(3)" $(2); fi
CHROMIUM := /usr/bin/chromium

# Debian's Chromium for tests/test_browser.py (playwright drives it; its own browser download is not
# used): installed with apt-get as root when missing, `apt-get update` only if the lists are stale.
# Without root the test skips and names the command.
chromium:
	$(call apt_install,test -x $(CHROMIUM),chromium,for tests/test_browser.py)

demo: $(STAMP)  ## TensorFlow's tutorial "Multi-worker training with Keras" on 1 and on 2 workers; writes out/
	$(BIN)/kit demo --out out

# Two tiers (README, Tests). make test: every test not marked `check` (tests/conftest.py: CHECK_MODULES) beside
# every notebook run once under nbval, plainly (notebook 11 without an emulated cluster, in
# tests/test_notebook_cluster.py); no root, no apt-get, nothing installed outside .venv (Horovod builds into it).
# Each half in two pytest-xdist workers (a notebook stays on one: --dist loadfile): both wait more than they compute.
test: $(HOROVOD_STAMP)  ## the tests and every notebook once: no root, nothing installed outside .venv
	@mkdir -p out; echo "the notebooks run beside the tests; their log (out/notebooks-plain.log) follows them"
	@$(NBVAL_PLAIN) notebooks/ >out/notebooks-plain.log 2>&1 & nb=$$!; \
	$(BIN)/python -m pytest tests -m "not check" --ignore=tests/exercises -n 2 --dist loadgroup --durations=15; u=$$?; \
	wait $$nb; n=$$?; echo "---- the notebooks (out/notebooks-plain.log)"; cat out/notebooks-plain.log; \
	echo "tests: exit $$u; notebooks: exit $$n"; test $$u$$n = 00

# make check (what .ci/run runs): every test, the check tier too, beside every notebook run once inside Binder's
# limits (make notebooks; 00, 01, 05 and 12 run in JupyterLab in tests/test_browser.py instead), then the site
# of those executed copies: one run of each notebook serves nbval's comparison, the Binder record and the site.
# The notebooks beside the unit tests, their log printed after them: one after the other left the 2 cores idle
# about a quarter of the unit tests' time (they wait for engines, queues, SSH logins) (docs/performance.md,
# change 22)
check: $(HOROVOD_STAMP) chromium netns-tools cluster-tools  ## make test's tests and the check tier beside the notebooks in Binder's limits, then the site
	@mkdir -p out; echo "make notebooks runs beside the unit tests; its log (out/notebooks.log) follows them"
	@$(MAKE) --no-print-directory notebooks >out/notebooks.log 2>&1 & nb=$$!; \
	$(MAKE) --no-print-directory unit; u=$$?; \
	wait $$nb; n=$$?; echo "---- make notebooks (out/notebooks.log)"; cat out/notebooks.log; \
	echo "make unit: exit $$u; make notebooks: exit $$n"; \
	$(MAKE) --no-print-directory site-check; s=$$?; echo "make site-check: exit $$s"; test $$u$$n$$s = 000

# `ip`, `tc` (iproute2) and `nsenter` (util-linux) for the private network and the emulated links
# (tests/test_links.py, notebook 10): installed with apt-get as root when `tc` is missing.
netns-tools:
	$(call apt_install,command -v tc >/dev/null,iproute2,for the emulated links)

# Debian's Slurm, munge and OpenSSH server for the emulated cluster (kit sim-cluster; tests/test_slurm_ssh.py) and
# nftables for its hosts' firewalls (tests/test_slurm_ssh.py): installed with apt-get as root when slurmd or nft is
# missing. Without root the tests skip and name the command.
cluster-tools: learner-tools
	$(call apt_install,{ command -v slurmd || test -x /usr/sbin/slurmd; } >/dev/null && { command -v nft || test -x /usr/sbin/nft; } >/dev/null,slurm-wlm munge openssh-server nftables,for the emulated Slurm and SSH hosts and their firewalls)

# acl (setfacl), for the ordinary user that runs the notebooks' kernels as root (make notebooks, make binder:
# AS_LEARNER) and the tests of tests/test_unprivileged.py: that user may then reach a Python under /root and write
# where it is granted. Installed with apt-get as root when setfacl is missing.
learner-tools:
	$(call apt_install,command -v setfacl >/dev/null,acl,for the unprivileged user of the notebooks and the tests)

# two pytest-xdist workers: the tests wait more than they compute (a serial run kept the 2 cores about half busy:
# 16:41 of wall time, 16:22 of CPU), so two at once take less time (tests/conftest.py groups them: one module per
# worker at a time, the emulated clusters' modules in one group, a temporary folder per worker)
# (not tests/test_site.py: it reads the site of the notebooks' run, which make check builds after this)
unit: $(HOROVOD_STAMP) chromium netns-tools cluster-tools
	$(BIN)/python -m pytest tests --ignore=tests/exercises --ignore=tests/test_site.py -n 2 --dist loadgroup \
	  --durations=25  # the 25 slowest

# every exercise that needs no shell (each notebook's metadata lists its parameters, cell edits and the error its
# text announces), run with papermill as a learner would in a fresh notebook; its own target, since it takes longer
# than make test allows (tests/exercises/test_exercises.py). Not in CI (.ci/run says why).
exercises: $(HOROVOD_STAMP) netns-tools  ## run every exercise that needs no shell (out/exercises/: the answers' runs)
	$(BIN)/python -m pytest tests/exercises

# the fast loop while editing: the tests not marked slow (none starts a cluster or another process that
# runs TensorFlow; each takes under ~2 s): about 50 s on 2 cores
quick: $(STAMP)  ## the fast loop: pytest -m "not slow"
	$(BIN)/python -m pytest -m "not slow" tests

# notebooks 00, 01, 05 and 12 run in JupyterLab in tests/test_browser.py (widgets, all their asserts);
# every other notebook runs here, with the text view. That run is also the proof that each fits a
# mybinder.org session: as root, inside a cgroup with Binder's 2 GiB of memory (tools/binder_cgroup.py),
# and notebook 07 (chief, 2 workers, ps) with Binder's 1 CPU as well, each with a Jupyter server
# (jupyter lab, --with-server) inside the group as on Binder, where the server shares the 2 GiB, and with
# nbval outside it: its kernels join the group (--kernels-inside), as the server's own kernels would. Then
# tests/test_binder_fit.py checks the records (every notebook passed, no out-of-memory kill, the server
# and the kit's processes inside, each notebook's peak working set and anonymous memory at most 90 % of
# 2 GiB, 1,843 MiB) and prints each notebook's time and peak memory, and which processes held it at the
# peak. Not root: plain runs, a notice, and the check skips saying why. Not every notebook gets 1 CPU: on
# 2 cores, `make binder` (all of them with 1 CPU) took 833 s of cells where these two runs took 461 + 57 s, too long
# for make check's 20 minutes (README, Binder and conda).
# The 1-CPU run goes beside the other (its quota holds it to one of the two cores; its log is printed after it):
# ~50 s less than one after the other.
BINDER_ONE_CPU := notebooks/07-parameter-server.ipynb
# Notebook 11 runs in neither: live, it starts Slurm's and sshd's daemons and network namespaces as root
# (the emulated cluster), which do not belong in a memory-limited cgroup; tests/test_notebook_cluster.py runs
# it, live and from its saved run (its metadata kit.not_on_binder; tests/test_notebook_cluster.py checks both lists).
NOT_ON_BINDER := --ignore=notebooks/11-your-own-cluster.ipynb
# Each notebook nbval runs is kept with its outputs in out/executed/ (tools/nbval_executed.py, a pytest plugin:
# the outputs nbval collected, no second run), for `make site`; the notebooks in notebooks/ stay without outputs.
EXECUTED := out/executed
# make test's: every notebook but NOT_ON_BINDER, in this Python's kernel, the live view as text
NBVAL_PLAIN := KIT_VIEW=text $(BIN)/python -m pytest --nbval-lax --nbval-cell-timeout=900 -p no:cacheprovider \
	--ignore=notebooks/out $(NOT_ON_BINDER) -n 2 --dist loadfile
# nbval on every notebook but NOT_ON_BINDER, its kernels started from tools/binder_cgroup.py's kernelspec
NBVAL_ALL := $(BIN)/python -m pytest --nbval-lax --nbval-kernel-name binder-cgroup --nbval-cell-timeout=900 \
	-p no:cacheprovider --ignore=notebooks/out $(NOT_ON_BINDER) -p tools.nbval_executed --nbval-executed $(EXECUTED)
NBVAL := $(NBVAL_ALL) --ignore=notebooks/00-tf-config-and-clusters.ipynb \
	--ignore=notebooks/01-single-vs-multi-worker.ipynb --ignore=notebooks/05-fault-tolerance.ipynb \
	--ignore=notebooks/12-keras3-jax.ipynb
# As root, the kernels (and every cluster they start) run as the ordinary user jovyan with new namespaces refused,
# as mybinder.org runs them (user jovyan, Docker's seccomp profile; tools/sandbox.py), writing only in notebooks/ and out/
# (always as root: a run as root is not Binder's, and tests/test_binder_fit.py fails it)
AS_LEARNER := $(shell [ "$$(id -u)" = 0 ] && echo --as-user jovyan --writable notebooks --writable out)
IN_BINDER := KIT_VIEW=text $(BIN)/python tools/binder_cgroup.py --if-possible --with-server --kernels-inside $(AS_LEARNER)
notebooks: $(HOROVOD_STAMP) netns-tools learner-tools
	rm -f out/binder-fit-*.json out/binder-fit-*.xml out/binder-fit-*.server.log out/binder-fit-*.log
	mkdir -p out
	$(IN_BINDER) --cpus 1 --record out/binder-fit-1cpu.json -- \
	  $(NBVAL) --junitxml=out/binder-fit-1cpu.xml $(BINDER_ONE_CPU) >out/binder-fit-1cpu.log 2>&1 & one=$$!; \
	$(IN_BINDER) --cpus none --record out/binder-fit-2gib.json -- \
	  $(NBVAL) $(addprefix --ignore=,$(BINDER_ONE_CPU)) --junitxml=out/binder-fit-2gib.xml notebooks/; a=$$?; \
	wait $$one; b=$$?; cat out/binder-fit-1cpu.log; \
	KIT_BINDER_RECORD=out/binder-fit-2gib.json:out/binder-fit-1cpu.json $(BIN)/python -m pytest -q -rsP \
	  -p no:cacheprovider tests/test_binder_fit.py::test_the_notebook_run_fit_in_binder_limits; c=$$?; \
	test $$a$$b$$c = 000

# every notebook (00, 01, 05 and 12 too) in one cgroup of Binder's size, 2 GiB and 1 CPU, with the Jupyter
# server inside, then the same check
binder: $(HOROVOD_STAMP) learner-tools  ## every notebook inside Binder's limits, as root -> out/binder.json, out/binder.xml
	rm -f out/binder.json out/binder.xml out/binder.server.log
	$(IN_BINDER) --cpus 1 --record out/binder.json -- $(NBVAL_ALL) --junitxml=out/binder.xml notebooks/; a=$$?; \
	KIT_BINDER_RECORD=out/binder.json $(BIN)/python -m pytest -q -rsP -p no:cacheprovider \
	  tests/test_binder_fit.py::test_the_notebook_run_fit_in_binder_limits; c=$$?; \
	test $$a$$c = 00

# The lessons as a static site, from the notebooks as `make notebooks` and tests/test_browser.py ran them
# (out/executed/, no second execution) -> out/site/index.html; tools/build_site.py stages the pages and runs
# Sphinx with myst-nb and sphinx-book-theme (docs/site/conf.py), offline. A notebook with no executed copy
# (notebook 11: neither runs it) is shown without outputs, with a note on its page and a warning here naming it.
site: $(SITE_STAMP)  ## the static site of the executed notebooks -> out/site/index.html
	$(BIN)/python tools/build_site.py --executed $(EXECUTED) --out out/site

# the site, then every page of it opened in Chromium (tests/test_site.py): make check's last step
site-check: site chromium
	$(BIN)/python -m pytest -p no:cacheprovider -rs tests/test_site.py

lab: $(LAB_STAMP)  ## open the notebooks in JupyterLab
	$(BIN)/jupyter lab notebooks/

bench: $(HOROVOD_STAMP)  ## efficiency, start-up, recovery, memory, notebook times -> out/bench/bench.json
	$(BIN)/kit bench --out out/bench

faults: $(STAMP)  ## 10 fault-injection trials (random task, random step) -> out/faults/trials.json
	$(BIN)/kit faults --trials 10 --out out/faults

compat: $(STAMP)  ## rerun the Keras compatibility table -> docs/keras-compatibility.md
	$(BIN)/python -m kit.tools.compat --out docs/keras-compatibility.md

clean:
	rm -rf out notebooks/out .pytest_cache
