package dev.kvant.engine;

/** The engine takes no more requests now: its queue is full, or it is shutting down. */
public class EngineBusyException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final boolean shuttingDown;

    public EngineBusyException(String message, boolean shuttingDown) {
        super(message);
        this.shuttingDown = shuttingDown;
    }

    public boolean shuttingDown() {
        return shuttingDown;
    }
}
