# Sourced by tests/run.sh, bench/ and deploy/local: installs what is missing.
# Pinned: torch 2.11.0 (its Linux wheel is built for CUDA 13.0; the GPU
# machines run the 2.11 series), safetensors and numpy for the Python oracle,
# transformers 5.17.0 (the GPU machines' version) as the llama family's oracle,
# peft 0.21.2 as LoRA's, bitsandbytes 0.50.2 as 8-bit AdamW's (its CPU backend;
# installed without its dependencies, which torch's already are), tensorboard 2.20.0 (its own event reader checks shardctl's
# event files), kubernetes-validate 1.37.0 (its Kubernetes schemas, 1.30
# among them) and kubectl (kubernetes-client where none is installed) for deploy/kubernetes; zsh to check shardctl's zsh completion (tests/e2e/cli.py);
# docker.io and debootstrap for deploy/docker, slurm-wlm, munge and shellcheck for deploy/slurm.
SHARDLINE_TORCH_VERSION="2.11.0"
SHARDLINE_TRANSFORMERS_VERSION="5.17.0"
SHARDLINE_PEFT_VERSION="0.21.2"
SHARDLINE_BITSANDBYTES_VERSION="0.50.2"
SHARDLINE_KUBERNETES_VALIDATE_VERSION="1.37.0"
SHARDLINE_TENSORBOARD_VERSION="2.20.0"
SHARDLINE_APT_PACKAGES=(build-essential cmake ninja-build pkg-config python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libtomlplusplus-dev libcli11-dev libsqlite3-dev libgtest-dev libgmock-dev libgloo-dev openssl libssl-dev zlib1g-dev nlohmann-json3-dev
  libmicrohttpd-dev prometheus-cpp-dev prometheus clang libclang-rt-14-dev systemd zsh
  dpkg-dev file docker.io debootstrap slurm-wlm munge shellcheck)

shardline_install_deps() {
  local missing=()
  for p in "${SHARDLINE_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # kubectl (its built-in kustomize renders deploy/kubernetes): Debian's, where no other kubectl is installed.
  command -v kubectl >/dev/null || missing+=(kubernetes-client)
  if ((${#missing[@]})); then
    echo "installing Debian packages: ${missing[*]}"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  local venv="$root/.venv"
  if ! "$venv/bin/python" -c "import torch,safetensors,numpy,sys; sys.exit(torch.__version__.split('+')[0] != '$SHARDLINE_TORCH_VERSION')" 2>/dev/null; then
    echo "creating $venv with torch==$SHARDLINE_TORCH_VERSION"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "torch==$SHARDLINE_TORCH_VERSION" numpy safetensors
  fi
  if ! "$venv/bin/python" -c "import transformers,sys; sys.exit(transformers.__version__ != '$SHARDLINE_TRANSFORMERS_VERSION')" 2>/dev/null; then
    echo "installing transformers==$SHARDLINE_TRANSFORMERS_VERSION into $venv"
    "$venv/bin/pip" install -q "transformers==$SHARDLINE_TRANSFORMERS_VERSION"
  fi
  if ! "$venv/bin/python" -c "import peft,sys; sys.exit(peft.__version__ != '$SHARDLINE_PEFT_VERSION')" 2>/dev/null; then
    echo "installing peft==$SHARDLINE_PEFT_VERSION into $venv"
    "$venv/bin/pip" install -q "peft==$SHARDLINE_PEFT_VERSION"
  fi
  if ! "$venv/bin/python" -c "import bitsandbytes,sys; sys.exit(bitsandbytes.__version__ != '$SHARDLINE_BITSANDBYTES_VERSION')" 2>/dev/null; then
    echo "installing bitsandbytes==$SHARDLINE_BITSANDBYTES_VERSION into $venv"
    "$venv/bin/pip" install -q --no-deps "bitsandbytes==$SHARDLINE_BITSANDBYTES_VERSION"
  fi
  if ! "$venv/bin/python" -c "import tensorboard,sys; sys.exit(tensorboard.__version__ != '$SHARDLINE_TENSORBOARD_VERSION')" 2>/dev/null; then
    echo "installing tensorboard==$SHARDLINE_TENSORBOARD_VERSION into $venv"
    "$venv/bin/pip" install -q "tensorboard==$SHARDLINE_TENSORBOARD_VERSION"
  fi
  if ! "$venv/bin/python" -c "import kubernetes_validate,sys; sys.exit(kubernetes_validate.__version__ != '$SHARDLINE_KUBERNETES_VALIDATE_VERSION')" 2>/dev/null; then
    echo "installing kubernetes-validate==$SHARDLINE_KUBERNETES_VALIDATE_VERSION into $venv"
    "$venv/bin/pip" install -q "kubernetes-validate==$SHARDLINE_KUBERNETES_VALIDATE_VERSION"
  fi
}
