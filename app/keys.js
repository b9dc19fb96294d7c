() => {
    // Explore's cycle player from the keyboard: ← / → step a cycle, Space plays or pauses. Keys in a field (text,
    // number, slider, radio, list) stay the field's; a checkbox (Presenter view, just ticked) has no use for the
    // arrows, so they step there too; Space on a focused button or checkbox presses it, as always.
    if (window.gumihoKeys) return;
    window.gumihoKeys = true;
    const KEYS = {ArrowLeft: "gm-previous", ArrowRight: "gm-next", " ": "gm-play"};
    const typing = (el) => el instanceof Element && (el.isContentEditable ||
        el.closest("input:not([type=checkbox]), textarea, select, [contenteditable]") !== null);
    const pressable = (el) => el instanceof Element &&
        el.closest("button, a, input, [role=button], [role=tab]") !== null;
    const button = (id) => {
        const el = document.getElementById(id);
        return el && el.tagName !== "BUTTON" ? el.querySelector("button") : el;
    };
    document.addEventListener("keydown", (event) => {
        const id = KEYS[event.key];
        if (!id || event.altKey || event.ctrlKey || event.metaKey || event.shiftKey || typing(event.target)) return;
        if (id === "gm-play" && (event.repeat || pressable(event.target))) return;
        const play = button("gm-play");
        if (!play || play.offsetParent === null) return;  // the Explore tab is not the one shown
        event.preventDefault();
        button(id).click();
    });
}
