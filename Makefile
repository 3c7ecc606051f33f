# The two commands of the README: `make run` and `make test`.
BUILD ?= build
ASAN ?= build-asan
JOBS ?= $(shell nproc)
MODEL ?= examples/mlp.yaml

.PHONY: all setup build build-asan run test test-fast bench clean

all: build

setup:
	@sh scripts/setup.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

$(ASAN)/Makefile: CMakeLists.txt
	cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DSPMD_SANITIZE=ON >/dev/null

build: setup $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

build-asan: setup $(ASAN)/Makefile
	cmake --build $(ASAN) -j $(JOBS)

# Install what is missing, build, and run the default example.
run: build
	./$(BUILD)/spmd run $(MODEL)

# Build and run every test, then again under ASan and UBSan.
test: build build-asan
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	./$(BUILD)/bench_einsum

clean:
	rm -rf $(BUILD) $(ASAN)
