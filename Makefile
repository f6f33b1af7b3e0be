# The two commands of the README: `make run` and `make test`. Each does its own set-up.

DATA_DIR ?= $(CURDIR)/.hostlet
RUN_FLAGS ?=
export CARGO_TERM_COLOR ?= never

.PHONY: run test deps images build lint unit fuzz bench clean-data

deps:
	bash hack/install-deps.sh

images: deps
	bash hack/images.sh

build: deps
	cargo build --release --bin hostlet

## Start hostlet with its own etcd member (data in $(DATA_DIR); ^C stops both).
run: images build
	./target/release/hostlet run --data-dir $(DATA_DIR) --advertise-address 127.0.0.1 $(RUN_FLAGS)

lint: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --all-features -- -D warnings

## Everything CI runs: lint, then every test against the real etcd and Docker engine.
test: images lint
	cargo nextest run --workspace --all-features --no-fail-fast

## Tests that need neither etcd nor Docker.
unit: deps
	cargo nextest run --workspace --lib --bins

## Parsing + validation fuzzing (needs nightly + cargo-fuzz; not run in CI). SECONDS=60 by default.
fuzz:
	cd fuzz && cargo +nightly fuzz run parse_validate -- -max_total_time=$${SECONDS_TO_RUN:-60}

## Benchmarks: make bench NAME=informer
bench: images
	bash hack/bench.sh $(NAME)

clean-data:
	rm -rf $(DATA_DIR)
