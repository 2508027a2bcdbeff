#!/bin/sh
# Usage: ./run.sh {k3|tfk|tf215} script.py [args]
# k3    : TF 2.21 + Keras 3 (no TF_USE_LEGACY_KERAS)
# tfk   : TF 2.21 + tf-keras (TF_USE_LEGACY_KERAS=1)
# tf215 : TF 2.15 + Keras 2 as tf.keras
stack=$1; shift
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONHASHSEED=0
case $stack in
  k3) unset TF_USE_LEGACY_KERAS; exec /work/main/.venv-tf2/bin/python "$@" ;;
  tfk) export TF_USE_LEGACY_KERAS=1; exec /work/main/.venv-tf2/bin/python "$@" ;;
  tf215) unset TF_USE_LEGACY_KERAS; exec /work/main/.venv-tf215/bin/python "$@" ;;
esac
