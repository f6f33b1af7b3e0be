# The two commands of the README: `make run` and `make test`. Each does its own set-up.

DATA_DIR ?= $(CURDIR)/.hostlet
RUN_FLAGS ?=
export CARGO_TERM_COLOR ?= never
# Where cargo puts its builds: every target below reads the binary from here.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

.PHONY: run test deps test-deps images image install uninstall build lint unit fuzz bench soak clean-data

deps:
	bash hack/install-deps.sh

## Also what only the tests need (cargo-fuzz, the Garage S3 server: built from source once, ~15 min).
test-deps:
	bash hack/install-deps.sh --tests

images: deps
	bash hack/images.sh

build: deps
	cargo build --release --bin hostlet

## The agent's image hostlet:latest from the release binary (BASE=debian:12-slim where a registry is reachable).
image: images build
	BASE=$(or $(BASE),scratch) bash hack/images.sh hostlet $(TARGET_DIR)/release/hostlet $(or $(TAG),hostlet:latest)

## This host: binary, systemd unit, /etc/default/hostlet, etcd.service masked (hack/install.sh --help).
install: build
	bash hack/install.sh --binary $(TARGET_DIR)/release/hostlet

## Removes the service; the data and /etc/default/hostlet stay (bash hack/install.sh --uninstall --purge removes them).
uninstall:
	bash hack/install.sh --uninstall

## Start hostlet with its own etcd member (data in $(DATA_DIR); ^C stops both).
run: images build
	$(TARGET_DIR)/release/hostlet run --data-dir $(DATA_DIR) --advertise-address 127.0.0.1 $(RUN_FLAGS)

lint: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --all-features -- -D warnings

## Everything CI runs: lint, then every test against the real etcd (Debian's 3.4) and Docker engine, then the
## etcd-facing tests again against etcd 3.5 (hack/test-etcd35.sh).
test: test-deps images lint
	cargo nextest run --workspace --all-features --no-fail-fast
	bash hack/test-etcd35.sh
	bash hack/fuzz.sh $(or $(FUZZ_SECONDS),20)

## Tests that need neither etcd nor Docker.
unit: deps
	cargo nextest run --workspace --lib --bins

## Every fuzz target for FUZZ_SECONDS each (20 by default; `make test` runs this), after its kept regression inputs.
fuzz: test-deps
	bash hack/fuzz.sh $(or $(FUZZ_SECONDS),20)

## Random faults on hosts in network namespaces for SECONDS (600 by default), SEED=… replays a run (root only).
soak: images
	SECONDS_TO_RUN=$(or $(SECONDS),600) bash hack/soak.sh

## Benchmarks: make bench NAME=informer
bench: images
	bash hack/bench.sh $(NAME)

clean-data:
	rm -rf $(DATA_DIR)
