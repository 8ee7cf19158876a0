from setuptools import find_packages, setup

# Upstream fairseq 0.12.2 neither installs nor imports on Python 3.11;
# ve-fairseq 0.12.3 is upstream main (2024-10) with the Python 3.11 dataclass
# fixes and prebuilt cp311/cp312 wheels. It imports as `fairseq`.
FAIRSEQ_PIN = "ve-fairseq==0.12.3"

setup(
    name="fairseq-hardattn",
    version="0.1.0",
    description=(
        "Efficient decoder attention for fairseq Transformers: hard retrieval, "
        "cross+self, average attention, flexible and local attention"
    ),
    # the plugin, and apart from it the tooling of scripts/ and research/
    # (benchmarks, scoring, plots, fixtures), which --user-dir never loads
    packages=find_packages(include=["fairseq_hardattn", "fairseq_hardattn.*", "hardattn_tools"]),
    # the native library is built against the installed PyTorch, by `make venv`
    # or on first use (fairseq_hardattn/kernels/build.py)
    package_data={"fairseq_hardattn.kernels": ["*.c", "*.cpp", "*.h"]},
    python_requires=">=3.10",
    install_requires=[
        FAIRSEQ_PIN,
        # torch is installed first by the Makefile (the local CPU wheel); a
        # range that admits it makes pip keep it instead of fetching CUDA wheels
        "torch>=2.1",
        "sacrebleu>=2.0",
        "subword-nmt>=0.3.8",
        "sacremoses>=0.1",  # detokenizing output for sacreBLEU
        "numpy",
        # fairseq's --tensorboard-logdir writes through it (and asks for it at import)
        "tensorboardX>=2.6",
    ],
    extras_require={
        # pytest 9.2's structured node ids silently break xdist's loadgroup
        # (pytest-xdist#1386): grouped tests would each set up their fixtures
        "test": ["pytest>=7,<9.2", "pytest-xdist>=3", "pytest-timeout>=2.1"],
        "plots": ["matplotlib>=3.5"],
        # the decoding benchmarks' peer (hardattn_tools/ctranslate2_peer.py); never needed by the plugin
        "bench": ["ctranslate2>=4.0"],
    },
)
