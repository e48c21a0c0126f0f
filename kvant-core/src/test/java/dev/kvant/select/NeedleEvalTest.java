package dev.kvant.select;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

class NeedleEvalTest {

    @Test
    void aNumberAnswerMustEndWhereTheKeyEnds() {
        assertNull(NeedleEval.verdict("123", "12345", false), "a beginning: go on");
        assertNull(NeedleEval.verdict("12345", "12345", false), "the next token may go on with the number");
        assertEquals(Boolean.FALSE, NeedleEval.verdict("123456", "12345", false), "a longer number is wrong");
        assertEquals(Boolean.TRUE, NeedleEval.verdict("12345.", "12345", false));
        assertEquals(Boolean.TRUE, NeedleEval.verdict("12345<|eot_id|>", "12345", false));
        assertEquals(Boolean.TRUE, NeedleEval.verdict("12345", "12345", true), "out of tokens at the answer");
        assertEquals(Boolean.FALSE, NeedleEval.verdict("12", "12345", true), "out of tokens before it");
        assertEquals(Boolean.FALSE, NeedleEval.verdict("13", "12345", false));
        // an answer that does not end in a digit is decided when it is there
        assertEquals(Boolean.TRUE, NeedleEval.verdict("Paris\"", "Paris\"", false));
        assertEquals(Boolean.TRUE, NeedleEval.verdict("Paris\" and", "Paris\"", false));
    }
}
