"""kit.train.probes.captured_tf_log: TensorFlow's Python log messages, collected instead of printed."""

import logging

from kit.train import probes


def test_captured_tf_log_collects_info_and_up_and_restores_the_logger():
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    logger = tf.get_logger()
    before = (logger.level, logger.handlers[:], logger.propagate)
    with probes.captured_tf_log() as messages:
        tf.compat.v1.logging.info("an info line")
        logger.warning("Your input ran out of data; interrupting training.")
        logger.debug("not collected")
    assert messages == ["an info line", "Your input ran out of data; interrupting training."]
    assert (logger.level, logger.handlers[:], logger.propagate) == before


def test_captured_tf_log_sees_a_deprecation_notice():
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    from tensorflow.python.util import deprecation

    @deprecation.deprecated(None, "use new_name instead")
    def old_name():
        return 1

    with probes.captured_tf_log() as messages:
        assert old_name() == 1
    assert any("is deprecated" in m and "use new_name instead" in m for m in messages), messages
    assert logging.getLogger("tensorflow") is tf.get_logger()
