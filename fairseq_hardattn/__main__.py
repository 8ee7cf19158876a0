"""``python -m fairseq_hardattn`` prints the plugin's directory, the value of
fairseq's ``--user-dir`` from any working directory::

    fairseq-train data-bin --user-dir "$(python -m fairseq_hardattn)" ...
"""

from . import USER_DIR

print(USER_DIR)
