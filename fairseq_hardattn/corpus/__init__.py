"""The corpus command (``python -m fairseq_hardattn translate``): a text file
of any size translated line by line with fairseq-interactive's options,
resumable, on every core or under a launcher's ranks. It drives fairseq's
task and generator as fairseq-interactive does (the plugin's engine decodes
where it runs the options); ``command`` is the command, ``lines`` its input,
``parts`` its output while it is made."""
